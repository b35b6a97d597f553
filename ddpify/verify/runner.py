"""``ddpify verify``: run a converted script under torch.distributed and judge what it did.

The CLI process never imports torch: it launches ``python -m torch.distributed.run`` (or
plain processes with Slurm's variables) over ``ddpify.verify.probe``, reads the JSON each
rank leaves behind, and runs the checks in ``ddpify.verify.checks``.

    report = verify(Path("train.py"), VerifyOptions(nproc=2, equivalence=True), progress=print)
    report.exit_code, report.checks, report.ranks, report.runs

``progress`` gets one line as each launched run starts and one as it ends (and, with
``VerifyOptions.verbose``, every line the ranks print, tagged with the run and the rank).
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
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from ddpify.verify.checks import Check, LaunchOutcome, run_checks

BACKENDS = ("auto", "gloo", "nccl")
LAUNCHERS = ("torchrun", "slurm-sim")
MISSING_TORCH = "torch is not installed here: pip install 'ddpify[verify]'"
# Variables a surrounding launcher may have set; each run starts from none of them.
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
# Where verify says what it is doing: one line at a time, as it happens.
Progress = Optional[Callable[[str], None]]


class CannotVerify(Exception):
    """Verification could not run (exit 2): bad arguments, torch missing."""


class ConversionRefused(CannotVerify):
    """ddpify refused to convert the script (exit 3, as `ddpify convert` exits)."""


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
    verbose: bool = False  # stream every line the ranks print to ``progress``


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
    # Every launched run, in order: label, processes, seconds, exit status, timed out.
    runs: tuple[dict, ...] = ()
    refused: bool = False  # the conversion was refused (exit 3, as `ddpify convert`)

    @property
    def exit_code(self) -> int:
        if self.error:
            return 3 if self.refused else 2
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
    label: str = "converted"  # how progress lines and tagged output name it
    purpose: str = ""  # said when it starts: "shuffling off, Dropout off"


class Session:
    """The runs of one verify: reports each as it starts and ends, and keeps their times."""

    def __init__(self, progress: Progress, verbose: bool) -> None:
        self.progress, self.verbose = progress, verbose
        self.runs: list[dict] = []

    def say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def echo(self) -> Progress:
        """Where the ranks' own output goes as it arrives (only with verbose)."""
        return self.progress if self.verbose else None


def verify(
    original: Path, converted: Path | None = None, options: VerifyOptions = VerifyOptions(), progress: Progress = None
) -> VerifyReport:
    """Convert (unless given the converted script), run, check. Never raises for user errors."""
    work = Path(tempfile.mkdtemp(prefix="ddpify-verify-"))
    setup = _describe(options)
    session = Session(progress, options.verbose)
    shown = str(converted or f"{original} (converted in memory)")
    try:
        _validate(options)
        script, notes = _converted_script(original, converted, work)
        session.say(f"verify {shown}: {options.nproc} ranks, {_launcher(options)}")  # the backend: when chosen
        for note in notes:
            session.say(f"note: {note}")
        env = _base_env(original, options)
        setup = _describe(options, _backend(options, env))
        main = Run(script, work / "probe-ddp", _cwd(options, work / "run-ddp"), purpose=setup.split(", ", 1)[1])  # "gloo, torchrun"
        outcome, reports = launch(main, options, env, session)
        checks = run_checks(outcome, reports)
        if options.equivalence:
            checks.append(_equivalence(original, main, reports, options, env, work, session))
        return VerifyReport(
            str(original), shown, setup,
            tuple(checks), tuple(_rank_row(r, reports[r]) for r in sorted(reports)), tuple(notes),
            output_tail=outcome.output_tail if any(c.passed is False for c in checks) else "",
            runs=tuple(session.runs),
        )
    except CannotVerify as error:
        refused = isinstance(error, ConversionRefused)
        return VerifyReport(str(original), str(converted or ""), setup, error=str(error), runs=tuple(session.runs), refused=refused)
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
        if any(d.code == "DDP001" for d in result.diagnostics):
            raise CannotVerify(f"{original}: {result.error}")
        raise ConversionRefused(f"{original}: {result.error}")
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


def _launcher(options: VerifyOptions) -> str:
    return "slurm-sim" if options.launcher == "slurm-sim" else (
        f"{options.nnodes_sim} torchrun launchers (simulated nodes)" if options.nnodes_sim > 1 else "torchrun"
    )


def _describe(options: VerifyOptions, backend: str | None = None) -> str:
    return f"{options.nproc} ranks, {backend or options.backend}, {_launcher(options)}"


# -- launching --------------------------------------------------------------------------------


# torch's gloo backend sometimes aborts a rank during interpreter shutdown, after the script
# finished and destroyed its process group; a torch-only DDP script shows it too. Such a run
# says nothing about the script: it is repeated (at most twice more).
GLOO_EXIT_ABORT = "terminate called without an active exception"


def launch(run: Run, options: VerifyOptions, env: dict, session: Session | None = None) -> tuple[LaunchOutcome, dict[int, dict]]:
    session = session or Session(None, False)
    for attempt in range(3):
        if attempt:
            session.say(f"{run.label}: torch's gloo backend aborted at interpreter exit; running it again ({attempt + 1} of 3)")
        outcome, reports = _launch_once(run, options, env, session)
        if outcome.returncode == 0 or outcome.timed_out or not _gloo_exit_abort(run, outcome):
            break
        for stale in run.probe_dir.glob("rank*"):
            stale.unlink()
    session.runs.append({
        "label": run.label, "processes": options.nproc, "seconds": round(outcome.seconds, 2),
        "returncode": outcome.returncode, "timed_out": outcome.timed_out, "attempts": attempt + 1,
    })
    return outcome, reports


def _gloo_exit_abort(run: Run, outcome: LaunchOutcome) -> bool:
    """The abort anywhere in the run's output, not only its tail: with simulated nodes the
    other node's launcher writes its exit-barrier wait after it."""
    if GLOO_EXIT_ABORT in outcome.output_tail:
        return True
    log = run.probe_dir / "output.log"
    return log.exists() and GLOO_EXIT_ABORT in log.read_text(encoding="utf-8", errors="replace")


def _processes(count: int) -> str:
    return f"{count} rank{'s' if count != 1 else ''}" if count > 1 else "1 process"


def _launch_once(run: Run, options: VerifyOptions, env: dict, session: Session) -> tuple[LaunchOutcome, dict[int, dict]]:
    run.probe_dir.mkdir(parents=True, exist_ok=True)
    env = {**env, **run.extra_env, "DDPIFY_PROBE_DIR": str(run.probe_dir), "DDPIFY_PROBE_TAG": run.label}
    log = run.probe_dir / "output.log"
    session.say(f"{run.label}: starting {_processes(options.nproc)} ({run.purpose})" if run.purpose else f"{run.label}: starting {_processes(options.nproc)}")
    started = time.monotonic()
    with open(log, "wb") as output:
        lock = threading.Lock()
        processes = [
            subprocess.Popen(
                command, cwd=run.cwd, env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
            )
            for command, extra in _commands(run, options)
        ]
        readers = [
            threading.Thread(target=_pump, args=(process.stdout, output, lock, session.echo(), run.label), daemon=True)
            for process in processes
        ]
        for reader in readers:
            reader.start()
        returncode, timed_out = _wait(processes, started + options.timeout)
        for reader in readers:
            reader.join(timeout=10)  # a straggler holding the pipe open must not hold verify
        with lock:
            output.flush()
            tail = log.read_text(errors="replace")[-3000:]
            output.close()
    seconds = time.monotonic() - started
    outcome = LaunchOutcome(options.nproc, returncode, timed_out, seconds, tail)
    session.say(f"{run.label}: {_ending(outcome)}")
    return outcome, _reports(run.probe_dir)


def _ending(outcome: LaunchOutcome) -> str:
    if outcome.timed_out:
        return f"timed out after {outcome.seconds:.0f} s; every process killed"
    who = f"{_processes(outcome.world_size)} exited" if outcome.world_size > 1 else "exited"
    return f"{who} {outcome.returncode} in {outcome.seconds:.1f} s"


def _pump(stream, log, lock: threading.Lock, echo: Progress, label: str) -> None:
    """Copy one launched process's output into the log as it comes, and to ``echo`` (-v);
    lines the probe did not tag with a rank (the launcher's own) get the run's label."""
    for raw in iter(stream.readline, b""):
        with lock:
            if log.closed:
                break
            log.write(raw)
        if echo is not None:
            text = raw.decode(errors="replace").rstrip("\r\n")
            echo(text if text.startswith(f"[{label}") else f"[{label}] {text}")
    stream.close()


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
    dropout: int = 0  # Dropout layers and functional dropout call sites active in training
    described: str = ""


def _equivalence(
    original: Path, main: Run, reports: dict, options: VerifyOptions, env: dict, work: Path, session: Session | None = None
) -> Check:
    """The original as one process and the converted world, shuffling off, same seed; with
    BatchNorm on batch statistics, both normalising with running statistics instead; with
    Dropout in training, both with dropout off."""
    session = session or Session(None, False)
    name = "same weights as the original run"
    if not reports or any(r["status"] != 0 for r in reports.values()):
        return Check(name, None, "the converted run did not finish")
    batchnorm = max(r.get("batchnorm_batch_stats", 0) for r in reports.values())
    dropout = max(r.get("dropout_in_training", 0) for r in reports.values())
    quiet = {
        "DDPIFY_PROBE_NO_SHUFFLE": "1",
        **({"DDPIFY_PROBE_BN_EVAL": "1"} if batchnorm else {}),
        **({"DDPIFY_PROBE_NO_DROPOUT": "1"} if dropout else {}),
    }
    changes = ", ".join(
        ["shuffling off"] + (["BatchNorm on running statistics"] if batchnorm else []) + (["Dropout off"] if dropout else [])
    )
    single = replace(options, nproc=1, nnodes_sim=1, launcher="plain")
    reference = Run(
        original.resolve(), work / "probe-original", _cwd(options, work / "run-original"), quiet,
        label="original", purpose=f"plain python, seed {options.seed}, {changes}",
    )
    outcome, original_reports = launch(reference, single, {**env, "DDPIFY_PROBE_PATH": ""}, session)
    if outcome.timed_out or 0 not in original_reports or original_reports[0]["status"] != 0:
        return Check(name, False, f"the original did not finish as one process:\n{outcome.output_tail[-800:]}")
    converted, compared = main, reports
    shuffled = any(r["shuffle"] for report in reports.values() for r in report["samplers"])
    if shuffled or batchnorm or dropout:
        converted = Run(
            main.script, work / "probe-ddp-quiet", _cwd(options, work / "run-ddp-quiet"), quiet,
            label="equivalence", purpose=f"the converted script again: {changes}",
        )
        outcome, compared = launch(converted, options, env, session)
        if outcome.timed_out or len(compared) != options.nproc:
            return Check(name, False, f"the converted run with {changes} did not finish")
    tolerance = _tolerance(options, batchnorm, dropout)
    result = _compare(reference.probe_dir / "rank0.pt", converted.probe_dir / "rank0.pt", tolerance, env)
    return _equivalence_verdict(name, result, tolerance)


def _tolerance(options: VerifyOptions, batchnorm_layers: int, dropout: int = 0) -> Tolerance:
    """BatchNorm in training normalises each process's part of the batch, as DataParallel's
    replicas did on their GPUs; one process on the whole batch cannot match that, so both
    runs normalised with the running statistics, and the report says so. Dropout draws a
    random mask per sample: one process draws the whole batch's masks from one stream, each
    rank its share's from its own, so no seed makes them alike; both runs ran with dropout
    off, and the report says so."""
    described = f"rtol {options.rtol:g}, atol {options.atol:g}"
    if batchnorm_layers:
        described += (
            f"; {batchnorm_layers} BatchNorm layer(s) normalised with their running statistics in both runs "
            "(per-process batch statistics are what DataParallel's replicas used too; one process cannot "
            "reproduce them)"
        )
    if dropout:
        described += (
            f"; {dropout} Dropout layer(s) or call(s) off in both runs (each rank draws the masks of its share "
            "of the batch from its own random stream; one process cannot draw the same masks)"
        )
    return Tolerance(options.rtol, options.atol, batchnorm_layers, dropout, described)


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
