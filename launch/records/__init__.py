"""A run's records and what reads them: the event log, run.json and RunResult, the train_dir lock,
finding runs (`launch list`), and the HTML report."""
