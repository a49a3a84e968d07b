"""The built-in TensorFlow training: the input pipelines of the data sets (cluster/checks/data.py
describes them), the CIFAR-10 tutorial model, the worker graph and its placement, the training
loop, summaries, the profiler. It knows nothing of launching."""
