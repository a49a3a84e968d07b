"""What the launcher checks before a task starts, and the task again as it starts: the data sets
`train.data` names (`data`, `idx`, and `download`, which fetches CIFAR-10), the memory a batch of the
built-in model needs (`memory`), and whether the user's program or command can be found (`code`).
Pure, no TensorFlow: the one part of the task side's checks that `launch` imports (setup.cfg's
contract keeps it out of the layers above)."""
