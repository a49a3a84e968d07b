"""What every task shares whatever it trains: the run directory and the task<->launcher protocol
(`rundir`), the chief session (`session`), the live set of workers (`membership`) and facts about
the host (`hostinfo`)."""
