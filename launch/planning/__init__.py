"""Planning: a validated spec in, one TaskPlan per task out (command, environment, TF_CONFIG, GPU
slots, log path). Pure: no processes, no network."""
