"""How many gradients a sync step aggregates: train.replicas_to_aggregate, or train.backup_workers
said the other way round (ClusterSpec.replicas_to_aggregate), checked against the workers. Pure."""
from __future__ import annotations

from cluster.spec.errors import Origins
from cluster.spec.model import ClusterSpec


def check_aggregation(spec: ClusterSpec, origins: Origins) -> None:
    """replicas_to_aggregate within the workers; backup_workers sync only, fewer than the workers,
    and not beside replicas_to_aggregate (the two say one thing)."""
    r, n, workers = spec.train.replicas_to_aggregate, spec.train.backup_workers, spec.num_workers
    if r is not None and not 1 <= r <= workers:
        raise origins.error('train.replicas_to_aggregate',
                            f'must be between 1 and the number of workers ({workers}), got {r}')
    if not n:
        return
    if not spec.train.sync:
        raise origins.error('train.backup_workers', 'backup workers are for sync training (train.sync is false): '
                                                    'async workers never wait for one another')
    if r is not None:
        raise origins.error('train.backup_workers', f'give train.backup_workers or train.replicas_to_aggregate, not '
                                                    f'both (backup_workers {n} means replicas_to_aggregate '
                                                    f'{max(1, workers - n)} of {workers})')
    if n >= workers:
        raise origins.error('train.backup_workers', f'must be fewer than the workers ({workers}), got {n}: '
                                                    'each global step needs the gradients of one worker at least')
