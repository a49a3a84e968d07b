"""Backends: how a supervised run starts, observes and stops its tasks: local processes (`local`,
`netns`), remote hosts over SSH (`ssh/`), containers of a compose project (`compose`), all behind
the interface of `base`."""
