"""The grid on Ray (``pip install 'torch-qlint[distributed]'``): one task per run.

* ``ray.init(address)`` joins a running cluster (``address="auto"`` or ``"ray://host:10001"``);
  without an address it starts a local one (``num_cpus`` CPUs, default all). A cluster that
  is already initialised in this process (e.g. by a test) is used as it is.
* Each run is a task with one CPU, and ``gpus_per_run`` of a GPU when the runs train on
  cuda (0.25 packs four small models on one GPU; Ray sets CUDA_VISIBLE_DEVICES per task).
* A task whose worker process dies (killed, out of memory, node lost) is retried up to
  ``max_retries`` times by Ray; a run that *raises* is not retried, it is reported as
  failed and, not being recorded, retried by the next invocation.
* Results come back through ``ray.wait`` in order of completion; the caller (the driver,
  :func:`qlint.verify.grid.run_grid`) is the only writer of runs.jsonl, so resume and
  shards work as with the local backend, and a lost worker loses nothing that was written.

Workers must import ``qlint`` (and the code of a custom ``run_fn``): on a local cluster
they share this environment; on a remote one, install torch-qlint there as well.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterator, Optional

from qlint.verify.train import RunConfig


def _import_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("--backend ray needs ray: pip install 'torch-qlint[distributed]'") from None
    return ray


def cluster_device(ray, requested: str) -> str:
    """The runs' device from the cluster's resources, not the driver's (which may have no GPU)."""
    has_gpu = ray.cluster_resources().get("GPU", 0) > 0
    if requested == "auto":
        return "cuda" if has_gpu else "cpu"
    if requested.startswith("cuda") and not has_gpu:
        raise RuntimeError("--device cuda requested but the Ray cluster has no GPU")
    return requested


def _run_task(fn: Callable[[RunConfig], dict], cfg: RunConfig) -> dict[str, Any]:
    """The body of one Ray task (``ray.remote`` takes a function, not any callable ``fn``)."""
    return fn(cfg)


def ray_outcomes(
    todo: list[RunConfig],
    fn: Callable[[RunConfig], dict],
    *,
    address: Optional[str] = None,
    num_cpus: Optional[int] = None,
    threads: int = 0,
    gpus_per_run: float = 0.25,
    max_retries: int = 3,
    log: Callable[[str], None] = print,
) -> Iterator[tuple[RunConfig, "dict[str, Any] | BaseException"]]:
    """Submit every run as a task; yield ``(config, record or exception)`` as they finish."""
    ray = _import_ray()
    started_here = not ray.is_initialized()
    pending: dict = {}
    if started_here:
        ray.init(address=address, num_cpus=None if address else num_cpus, log_to_driver=False)
    try:
        device = cluster_device(ray, todo[0].device)
        on_gpu = device.startswith("cuda")
        # one intra-op thread per CPU task, as in the local backend
        todo = [replace(c, device=device, threads=threads or (0 if on_gpu else 1)) for c in todo]
        task = ray.remote(_run_task).options(
            num_cpus=1, num_gpus=gpus_per_run if on_gpu else 0, max_retries=max_retries, retry_exceptions=False
        )
        resources = ray.cluster_resources()
        log(f"ray: {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs; "
            f"{len(todo)} tasks on {device}" + (f", {gpus_per_run:g} GPU each" if on_gpu else ""))
        pending.update({task.remote(fn, cfg): cfg for cfg in todo})
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                cfg = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # the run raised: report its own exception
                    outcome = exc.cause if isinstance(exc.cause, BaseException) else exc
                except Exception as exc:  # noqa: BLE001 - e.g. its worker died max_retries + 1 times
                    outcome = exc
                yield cfg, outcome
    finally:
        for ref in pending:  # the driver stopped early: nobody would record these
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()
