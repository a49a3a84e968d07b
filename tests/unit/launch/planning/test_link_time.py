"""`launch plan --link`'s step model (launch/planning/link_time.py) against hand-computed cases:
the bytes on each host's link, the step time with and without a known compute, sync and async,
and the ps count advice."""
from __future__ import annotations

import pytest
import yaml

from cluster.spec import load_spec
from launch.planning import link_time, ps_load

M = 4_273_192       # the built-in model's weights, float32 (CIFAR-10 24x24x3)


def spec_of(tmp_path, ps: list[str], workers: list[str], **train):
    settings = {'sync': True, 'batch_size': 64, 'data': 'synthetic', 'train_dir': str(tmp_path / 'run'), **train}
    path = tmp_path / 'spec.yaml'
    path.write_text(yaml.safe_dump({'cluster': {'ps': ps, 'worker': workers}, 'train': settings}))
    spec = load_spec(str(path))
    load = ps_load.builtin_load(spec)
    assert load is not None
    return spec, load


@pytest.mark.parametrize('text, mbit', [('1gbit', 1000.0), ('10gbit', 10000.0), ('100mbit', 100.0), ('2.5g', 2500.0),
                                        ('400', 400.0), ('10 Gbit/s', 10000.0), ('1Gbps', 1000.0)])
def test_rates(text, mbit):
    assert link_time.parse_rate(text) == mbit


@pytest.mark.parametrize('text', ['fast', '0', '1 gigabit', '-1gbit', ''])
def test_a_rate_it_cannot_read_says_what_it_expected(text):
    with pytest.raises(ValueError, match=r'--link: expected a rate such as 1gbit'):
        link_time.parse_rate(text)


def test_one_ps_on_a_host_of_its_own_sends_the_model_to_each_worker(tmp_path):
    spec, load = spec_of(tmp_path, ['a:1'], ['b:1', 'c:1'])
    moved = link_time.traffic(load, spec)
    assert moved.by_host == {'a': 2 * M, 'b': M, 'c': M}
    assert moved.busiest == ('a', 2 * M) and moved.worker_bytes == M


def test_a_ps_beside_a_worker_serves_that_worker_over_loopback(tmp_path):
    spec, load = spec_of(tmp_path, ['a:1'], ['a:2', 'c:1'])
    moved = link_time.traffic(load, spec)
    assert moved.by_host == {'a': M, 'c': M}       # ps:0 to worker:1, and worker:1's pull


def test_every_task_on_one_host_crosses_no_link(tmp_path):
    spec, load = spec_of(tmp_path, ['a:1'], ['a:2', 'a:3'])
    p = link_time.predict(load, spec, 1000, 64, 500)
    assert p.link_secs == 0 and p.bound_images_per_sec is None
    assert p.secs == pytest.approx(128 / 500)      # the compute alone


def test_sync_step_is_the_longer_plus_half_the_shorter(tmp_path):
    spec, load = spec_of(tmp_path, ['a:1'], ['b:1', 'c:1'])
    link = 2 * M / (1000e6 / 8)             # 68.4 ms: the ps host's two workers' worth
    compute = 128 / 544                     # a global step's 128 images at 544 images/s unlimited
    p = link_time.predict(load, spec, 1000, 64, 544)
    assert p.link_secs == pytest.approx(link)
    assert p.secs == pytest.approx(compute + 0.5 * link)
    assert p.images_per_sec == pytest.approx(128 / (compute + 0.5 * link))
    assert p.bound_images_per_sec == pytest.approx(128 / link)
    assert link_time.predict(load, spec, 1000, 64, 544, exposed=0).images_per_sec == pytest.approx(544)


def test_without_a_compute_only_the_links_bound_is_told(tmp_path):
    spec, load = spec_of(tmp_path, ['a:1'], ['b:1', 'c:1'])
    p = link_time.predict(load, spec, 1000, 64)
    assert p.secs is None and p.images_per_sec is None and p.compute_secs is None
    assert p.to_json()['step_secs'] is None and p.to_json()['busiest_host'] == 'a'


def test_async_each_worker_cycles_on_its_own_link_under_the_ps_links_cap(tmp_path):
    spec, load = spec_of(tmp_path, ['a:1'], ['b:1', 'c:1'], sync=False)
    r = 1000e6 / 8
    compute = 2 * 64 / 544                  # each worker's batch, the two sharing 544 images/s
    cycle = compute + 0.5 * (M / r)         # its own link moves the model each way
    p = link_time.predict(load, spec, 1000, 64, 544)
    assert p.unit == 'update'
    assert p.images_per_sec == pytest.approx(min(2 / cycle, r / M) * 64)
    slow = link_time.predict(load, spec, 10, 64, 544)      # 10 Mbit/s: the ps link caps every update
    assert slow.images_per_sec == pytest.approx(10e6 / 8 / M * 64)


def test_the_advice_spreads_the_ps_until_a_workers_own_link_is_the_limit(tmp_path):
    """8 workers on 1 ps: the ps link moves 8 M a step. k ps tasks on hosts of their own move
    8 M s_max each; the worker links move M whatever k, so more ps help until 8 M s_max <= M."""
    spec, load = spec_of(tmp_path, ['p:1'], [f'w{i}:1' for i in range(8)])
    now = link_time.predict(load, spec, 1000, 64)
    workers = [f'w{i}' for i in range(8)]
    tip = link_time.ps_advice(now, lambda k: ps_load.per_ps_wire_bytes(spec, k), workers, True, 64, None)
    assert tip is not None and tip.num_ps >= 8
    assert tip.then.link_secs == pytest.approx(M / (1000e6 / 8), rel=0.05)
    assert now.link_secs == pytest.approx(8 * M / (1000e6 / 8))
    assert 'max(M, n x M / k)' in tip.line()


def test_no_advice_where_the_ps_links_are_not_the_limit(tmp_path):
    spec, load = spec_of(tmp_path, ['p:1', 'q:1'], ['w0:1'])
    now = link_time.predict(load, spec, 1000, 64)
    assert link_time.ps_advice(now, lambda k: ps_load.per_ps_wire_bytes(spec, k), ['w0'], True, 64, None) is None
