"""The built-in TensorFlow training: the data sets (CIFAR-10, synthetic, Fashion-MNIST and other IDX
files) and their input pipelines, the CIFAR-10 tutorial model, the worker graph and its placement,
the training loop, summaries, the profiler. It knows nothing of launching."""
