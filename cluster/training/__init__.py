"""The built-in TensorFlow training: the CIFAR-10 model, the input pipeline, the worker graph and its
placement, the training loop, summaries, the profiler. It knows nothing of launching."""
