"""``ddpify verify``: run a converted script under torch.distributed and judge what it did.

The CLI process never imports torch: it launches ``python -m torch.distributed.run`` (or
plain processes with Slurm's variables) over ``ddpify.verify.probe``, reads the JSON each
rank leaves behind, and runs the checks in ``ddpify.verify.checks``.

    report = verify(Path("train.py"), VerifyOptions(nproc=2, equivalence=True))
    report.exit_code, report.checks, report.ranks
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ddpify.verify.checks import Check, LaunchOutcome, run_checks

BACKENDS = ("auto", "gloo", "nccl")
LAUNCHERS = ("torchrun", "slurm-sim")
MISSING_TORCH = "torch is not installed here: pip install 'ddpify[verify]'"
# Variables a surrounding launcher may have set; each run starts from none of them.
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


class CannotVerify(Exception):
    """Verification could not run (exit 2): bad arguments, torch missing, conversion refused."""


@dataclass(frozen=True)
class VerifyOptions:
    nproc: int = 2
    backend: str = "auto"
    nnodes_sim: int = 1
    launcher: str = "torchrun"
    timeout: float = 600.0
    max_steps: int | None = None
    equivalence: bool = False
    cwd: Path | None = None
    script_args: tuple[str, ...] = ()
    rtol: float = 1e-5
    atol: float = 1e-6
    seed: int = 0


@dataclass(frozen=True)
class VerifyReport:
    original: str
    converted: str
    setup: str
    checks: tuple[Check, ...] = ()
    ranks: tuple[dict, ...] = ()
    notes: tuple[str, ...] = ()
    error: str | None = None
    output_tail: str = ""

    @property
    def exit_code(self) -> int:
        if self.error:
            return 2
        return 1 if any(check.passed is False for check in self.checks) else 0

    def to_json(self) -> str:
        data = asdict(self)
        data["checks"] = [{**asdict(c), "verdict": c.verdict} for c in self.checks]
        data["exit_code"] = self.exit_code
        return json.dumps(data, indent=2)


@dataclass
class Run:
    """One launched world: where it runs and what it left."""

    script: Path
    probe_dir: Path
    cwd: Path
    extra_env: dict = field(default_factory=dict)


def verify(original: Path, converted: Path | None = None, options: VerifyOptions = VerifyOptions()) -> VerifyReport:
    """Convert (unless given the converted script), run, check. Never raises for user errors."""
    work = Path(tempfile.mkdtemp(prefix="ddpify-verify-"))
    setup = _describe(options)
    try:
        _validate(options)
        script, notes = _converted_script(original, converted, work)
        env = _base_env(original, options)
        setup = _describe(options, _backend(options, env))
        main = Run(script, work / "probe-ddp", _cwd(options, work / "run-ddp"))
        outcome, reports = launch(main, options, env)
        checks = run_checks(outcome, reports)
        if options.equivalence:
            checks.append(_equivalence(original, main, reports, options, env, work))
        return VerifyReport(
            str(original), str(converted or f"{original} (converted in memory)"), setup,
            tuple(checks), tuple(_rank_row(r, reports[r]) for r in sorted(reports)), tuple(notes),
            output_tail=outcome.output_tail if any(c.passed is False for c in checks) else "",
        )
    except CannotVerify as error:
        return VerifyReport(str(original), str(converted or ""), setup, error=str(error))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _validate(options: VerifyOptions) -> None:
    if importlib.util.find_spec("torch") is None:
        raise CannotVerify(MISSING_TORCH)
    if options.backend not in BACKENDS:
        raise CannotVerify(f"--backend must be one of {', '.join(BACKENDS)}")
    if options.launcher not in LAUNCHERS:
        raise CannotVerify(f"--launcher must be one of {', '.join(LAUNCHERS)}")
    if options.nproc < 1 or options.nnodes_sim < 1 or options.nproc % options.nnodes_sim:
        raise CannotVerify("--nproc must be a positive multiple of --nnodes-sim")
    if options.nnodes_sim > 1 and options.launcher != "torchrun":
        raise CannotVerify("--nnodes-sim simulates torchrun launchers; it does not combine with --launcher slurm-sim")
    if options.max_steps is not None and options.max_steps < 1:
        raise CannotVerify("--max-steps must be at least 1")


def _converted_script(original: Path, converted: Path | None, work: Path) -> tuple[Path, list[str]]:
    from ddpify.api import convert_file
    from ddpify.config import ConfigError, find_config
    from ddpify.diagnostics import ConvertOptions

    if not original.is_file():
        raise CannotVerify(f"no such file: {original}")
    if converted is not None:
        if not converted.is_file():
            raise CannotVerify(f"no such file: {converted}")
        return converted.resolve(), []
    try:
        config = find_config([original])
    except ConfigError as error:
        raise CannotVerify(str(error)) from None
    # The same options `ddpify convert` would take from [tool.ddpify].
    result = convert_file(original, ConvertOptions(per_process_batch=config.per_process_batch))
    if result.error:
        raise CannotVerify(f"{original}: {result.error}")
    target = work / "converted" / original.name
    target.parent.mkdir()
    target.write_text(result.output, encoding="utf-8")
    if not result.changed:
        return target, [f"{original} has no DataParallel to convert: verifying it as it is"]
    return target, []


def _base_env(original: Path, options: VerifyOptions) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["DDPIFY_PROBE_PATH"] = str(original.resolve().parent)
    # The probe must import from this ddpify, wherever the script's folder is.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    if options.max_steps is not None:
        env["DDPIFY_PROBE_MAX_STEPS"] = str(options.max_steps)
    if options.equivalence:
        env["DDPIFY_PROBE_SEED"] = str(options.seed)
    return env


def _backend(options: VerifyOptions, env: dict) -> str:
    """gloo hides the GPUs (the emitted set-up picks NCCL whenever CUDA is visible)."""
    per_node = options.nproc // options.nnodes_sim
    if options.backend == "gloo" or env.get("CUDA_VISIBLE_DEVICES") == "":
        env["CUDA_VISIBLE_DEVICES"] = ""
        return "gloo"
    gpus = _gpu_count(env)
    if gpus >= per_node:
        return "nccl"
    if options.backend == "nccl":
        raise CannotVerify(f"--backend nccl needs {per_node} GPU(s) per node; this machine has {gpus}")
    env["CUDA_VISIBLE_DEVICES"] = ""
    return "gloo"


def _gpu_count(env: dict) -> int:
    probe = [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"]
    result = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    return int(result.stdout.strip() or 0) if result.returncode == 0 else 0


def _cwd(options: VerifyOptions, default: Path) -> Path:
    if options.cwd is not None:
        return options.cwd.resolve()
    default.mkdir(parents=True, exist_ok=True)
    return default


def _describe(options: VerifyOptions, backend: str | None = None) -> str:
    launcher = "slurm-sim" if options.launcher == "slurm-sim" else (
        f"{options.nnodes_sim} torchrun launchers (simulated nodes)" if options.nnodes_sim > 1 else "torchrun"
    )
    return f"{options.nproc} ranks, {backend or options.backend}, {launcher}"


# -- launching --------------------------------------------------------------------------------


# torch's gloo backend sometimes aborts a rank during interpreter shutdown, after the script
# finished and destroyed its process group; a torch-only DDP script shows it too. Such a run
# says nothing about the script: it is repeated (at most twice more).
GLOO_EXIT_ABORT = "terminate called without an active exception"


def launch(run: Run, options: VerifyOptions, env: dict) -> tuple[LaunchOutcome, dict[int, dict]]:
    for _ in range(3):
        outcome, reports = _launch_once(run, options, env)
        if outcome.returncode == 0 or outcome.timed_out or GLOO_EXIT_ABORT not in outcome.output_tail:
            break
        for stale in run.probe_dir.glob("rank*"):
            stale.unlink()
    return outcome, reports


def _launch_once(run: Run, options: VerifyOptions, env: dict) -> tuple[LaunchOutcome, dict[int, dict]]:
    run.probe_dir.mkdir(parents=True, exist_ok=True)
    env = {**env, **run.extra_env, "DDPIFY_PROBE_DIR": str(run.probe_dir)}
    log = run.probe_dir / "output.log"
    started = time.monotonic()
    with open(log, "w") as output:
        processes = [
            subprocess.Popen(command, cwd=run.cwd, env={**env, **extra}, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
            for command, extra in _commands(run, options)
        ]
        returncode, timed_out = _wait(processes, started + options.timeout)
    seconds = time.monotonic() - started
    tail = log.read_text(errors="replace")[-3000:]
    outcome = LaunchOutcome(options.nproc, returncode, timed_out, seconds, tail)
    return outcome, _reports(run.probe_dir)


def _commands(run: Run, options: VerifyOptions) -> list[tuple[list[str], dict]]:
    probe = ["-m", "ddpify.verify.probe", str(run.script), *options.script_args]
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    if options.launcher == "plain":  # the original, as one ordinary process
        return [([sys.executable, *probe], {})]
    if options.launcher == "slurm-sim":
        port = str(free_port())
        return [
            ([sys.executable, *probe], {
                "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(options.nproc), "SLURM_LOCALID": str(rank),
                "SLURM_NODELIST": "127.0.0.1", "MASTER_PORT": port,
            })
            for rank in range(options.nproc)
        ]
    if options.nnodes_sim == 1:
        # --standalone rendezvous binds a free port itself: parallel runs never collide.
        return [([*torchrun, "--standalone", f"--nproc-per-node={options.nproc}", *probe], {})]
    port = str(free_port())
    per_node = options.nproc // options.nnodes_sim
    return [
        ([*torchrun, f"--nnodes={options.nnodes_sim}", f"--node-rank={node}", f"--nproc-per-node={per_node}",
          "--master-addr=127.0.0.1", f"--master-port={port}", *probe], {})
        for node in range(options.nnodes_sim)
    ]


def _wait(processes: list[subprocess.Popen], deadline: float) -> tuple[int | None, bool]:
    """The first non-zero exit status (else 0), and whether the deadline killed the world."""
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                _kill(other)
            return None, True
    return next((p.returncode for p in processes if p.returncode), 0), False


def _kill(process: subprocess.Popen) -> None:
    """The launcher and every process under it: torchrun starts its workers in sessions of
    their own, so killing its process group alone leaves hung ranks running."""
    for pid in [*_descendants(process.pid), process.pid]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
    process.wait()


def _descendants(root: int) -> list[int]:
    """Child processes of ``root``, at any depth (read from /proc; none elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat") if Path("/proc").is_dir() else []:
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    found, pending = [], [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _reports(directory: Path) -> dict[int, dict]:
    reports = {}
    for path in directory.glob("rank*.json"):
        data = json.loads(path.read_text())
        reports[int(data["rank"])] = data
    return reports


# -- equivalence ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    batchnorm_layers: int = 0  # in the converted world, normalising with batch statistics
    described: str = ""


def _equivalence(original: Path, main: Run, reports: dict, options: VerifyOptions, env: dict, work: Path) -> Check:
    """The original as one process and the converted world, shuffling off, same seed; with
    BatchNorm on batch statistics, both normalising with running statistics instead."""
    name = "same weights as the original run"
    if not reports or any(r["status"] != 0 for r in reports.values()):
        return Check(name, None, "the converted run did not finish")
    batchnorm = max(r.get("batchnorm_batch_stats", 0) for r in reports.values())
    quiet = {"DDPIFY_PROBE_NO_SHUFFLE": "1", **({"DDPIFY_PROBE_BN_EVAL": "1"} if batchnorm else {})}
    single = replace(options, nproc=1, nnodes_sim=1, launcher="plain")
    reference = Run(original.resolve(), work / "probe-original", _cwd(options, work / "run-original"), quiet)
    outcome, original_reports = launch(reference, single, {**env, "DDPIFY_PROBE_PATH": ""})
    if outcome.timed_out or 0 not in original_reports or original_reports[0]["status"] != 0:
        return Check(name, False, f"the original did not finish as one process:\n{outcome.output_tail[-800:]}")
    converted, compared = main, reports
    shuffled = any(r["shuffle"] for report in reports.values() for r in report["samplers"])
    if shuffled or batchnorm:
        converted = Run(main.script, work / "probe-ddp-quiet", _cwd(options, work / "run-ddp-quiet"), quiet)
        outcome, compared = launch(converted, options, env)
        if outcome.timed_out or len(compared) != options.nproc:
            return Check(name, False, "the converted run with shuffling off did not finish")
    tolerance = _tolerance(options, batchnorm)
    result = _compare(reference.probe_dir / "rank0.pt", converted.probe_dir / "rank0.pt", tolerance, env)
    return _equivalence_verdict(name, result, tolerance)


def _tolerance(options: VerifyOptions, batchnorm_layers: int) -> Tolerance:
    """BatchNorm in training normalises each process's part of the batch, as DataParallel's
    replicas did on their GPUs; one process on the whole batch cannot match that, so both
    runs normalised with the running statistics, and the report says so."""
    described = f"rtol {options.rtol:g}, atol {options.atol:g}"
    if batchnorm_layers:
        described += (
            f"; {batchnorm_layers} BatchNorm layer(s) normalised with their running statistics in both runs "
            "(per-process batch statistics are what DataParallel's replicas used too; one process cannot "
            "reproduce them)"
        )
    return Tolerance(options.rtol, options.atol, batchnorm_layers, described)


def _equivalence_verdict(name: str, result: dict, tolerance: Tolerance) -> Check:
    worst = result["max_abs_diff"]
    difference = f"max |difference| {worst:.2e}; " if worst is not None else ""
    if result["equal"]:
        return Check(name, True, f"{difference}{tolerance.described}")
    return Check(name, False, f"{result['reason']} ({difference}{tolerance.described})")


def _compare(original: Path, converted: Path, tolerance: Tolerance, env: dict) -> dict:
    command = [sys.executable, "-m", "ddpify.verify.compare", str(original), str(converted), str(tolerance.rtol), str(tolerance.atol)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if result.returncode:
        return {"equal": False, "reason": " ".join(result.stderr.strip().splitlines()[-1:]), "max_abs_diff": None}
    return json.loads(result.stdout)


def _rank_row(rank: int, report: dict) -> dict:
    group = report["process_group"] or {}
    return {
        "rank": rank,
        "local_rank": group.get("local_rank"),
        "exit": report["status"],
        "seconds": report.get("seconds"),
        "steps": report["steps"],
        "backend": group.get("backend", "-"),
        "ddp_models": report["ddp_models"],
        "training_passes": sum(1 for r in report["samplers"] if r["steps_at_end"] > r["steps_at_start"]),
        "printed_lines": len(report["outputs"]),
        "saves": len(report["saves"]),
        "files_written": len({w["path"] for w in report["written_files"]}),
        "param_hash": (_weights(report) or {}).get("hash", "-")[:12],
    }


def _weights(report: dict) -> dict | None:
    """The weights summary the checks compare: after the last optimizer step, else at exit."""
    weights = report.get("weights") or {}
    return weights.get("after_last_step") or weights.get("at_exit")
