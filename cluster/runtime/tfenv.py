"""The environment every task of a coordinator run (TF2 ParameterServerStrategy) needs before
TensorFlow starts: the launcher puts it in each task's environment (and in rendered files), and a
task started by hand sets it itself (cluster/task.py)."""
from __future__ import annotations

KERAS_ENV = {'TF_USE_LEGACY_KERAS': '1'}      # tf.keras is then Keras 2 (tf-keras): the only Keras with PSS
FAIL_FAST_ENV = {'GRPC_FAIL_FAST': 'use_caller'}     # PSS tolerates a lost worker only with this


def coordinator_env() -> dict[str, str]:
    """What every task of a coordinator run needs in its environment before TensorFlow starts."""
    return {**FAIL_FAST_ENV, **KERAS_ENV}
