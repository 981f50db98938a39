"""The `mixgraph` command line (DESIGN §2).

Exit codes: 0 success, 2 invalid workflow or arguments (nothing executed), 1 a node failed,
130 interrupted. Each command's implementation lives beside this module in ui/ (`server`, `demo`,
`bench_engine`, `bench_precision`); they are imported when their command runs, so `mixgraph
validate` does not pay for aiohttp or the benchmarks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from mixgraph.graph.env import check_device
from mixgraph.ui.comfy.comfy_flags import add_cache_flags, add_comfy_flags, add_memory_flag, cache_from_args

EXIT_OK, EXIT_NODE_FAILED, EXIT_INVALID, EXIT_INTERRUPTED = 0, 1, 2, 130


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", metavar="DIR", help="model folder (env MIXGRAPH_MODELS; default ./models)")
    p.add_argument("--input", metavar="DIR", help="input folder for LoadImage (default ./input)")


def _custom_nodes(p: argparse.ArgumentParser, base_directory: bool = True) -> None:
    """ComfyUI's custom-node flags (ui/comfy/custom_nodes.py loads the packs). `serve` gets
    `--base-directory` from ComfyUI's server flags (ui/comfy/comfy_flags.py), with its wider meaning."""
    p.add_argument("--custom-nodes", action="append", default=[], metavar="DIR",
                   help="also load ComfyUI custom node packs from DIR (repeatable)")
    p.add_argument("--disable-all-custom-nodes", action="store_true",
                   help="load no custom node packs")
    if base_directory:
        p.add_argument("--base-directory", metavar="DIR",
                       help="the folder whose custom_nodes/ packs are loaded (default: the working one)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 1 to 65535, not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mixgraph", description="Node-graph workflow engine for "
                                     "Stable Diffusion with per-subgraph precision.")
    from mixgraph import __version__
    parser.add_argument("--version", action="version", version=f"mixgraph {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="validate then execute a workflow headless")
    p.add_argument("workflow", metavar="WF.json")
    p.add_argument("--set", action="append", default=[], metavar="ID.INPUT=VALUE",
                   help="override an input (VALUE is JSON when it parses, else a string)")
    p.add_argument("--precision", metavar="SPEC|TYPE=SPEC,...",
                   help="run default (beats the file's default) and/or per-socket-type defaults, "
                        "e.g. bf16 or MODEL=bf16,VAE=f32")
    _common(p)
    p.add_argument("--output", metavar="DIR", help="output folder (default ./output)")
    p.add_argument("--report", metavar="FILE", help="write the run report as JSON")
    p.add_argument("--device", metavar="D", help="cpu, cuda, cuda:N, mps (default cpu)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_memory_flag(p)
    _custom_nodes(p)
    add_cache_flags(p)

    p = sub.add_parser("validate", help="check a workflow without running it")
    p.add_argument("workflow", metavar="WF.json")
    p.add_argument("--json", action="store_true", help="ComfyUI's error body")
    _common(p)
    _custom_nodes(p)

    p = sub.add_parser("nodes", help="the node catalogue (as GET /object_info)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--system", action="store_true", help="instead: the system section (memory, "
                   "native bf16/f16/int8 per device, what auto and each preset resolve to)")
    p.add_argument("--device", metavar="D", help="device for --system (default cpu)")
    add_memory_flag(p)
    _common(p)
    _custom_nodes(p)

    p = sub.add_parser("estimate", help="predicted peak memory of a workflow, per node and preset")
    p.add_argument("workflow", metavar="WF.json")
    p.add_argument("--precision", metavar="SPEC|TYPE=SPEC,...")
    p.add_argument("--set", action="append", default=[], metavar="ID.INPUT=VALUE")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", metavar="D")
    add_memory_flag(p)
    _common(p)
    _custom_nodes(p)

    p = sub.add_parser("serve", help="HTTP/WebSocket server and the browser editor")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="address(es) to listen on, comma-separated (default 127.0.0.1: this machine "
                        "only; any other needs --token or --insecure)")
    p.add_argument("--port", type=_port, default=8188, metavar="N",
                   help="TCP port to listen on (default 8188, as ComfyUI)")
    p.add_argument("--output", metavar="DIR", help="output folder (default ./output)")
    p.add_argument("--token", help="bearer token required from clients")
    p.add_argument("--insecure", action="store_true", help="listen beyond localhost without a token")
    p.add_argument("--device", metavar="D")
    p.add_argument("--max-history", type=_positive, metavar="N",
                   help="finished prompts kept in the history (default 10000, as ComfyUI)")
    g = p.add_argument_group("what one request may ask (defaults generous for real use; "
                             "README, 'The editor')")
    g.add_argument("--max-request-mb", type=float, metavar="MB",
                   help="largest JSON request body, a prompt with its workflow (default 32)")
    g.add_argument("--max-text-length", type=_positive, metavar="N",
                   help="longest text of one STRING input, in characters (default 100000)")
    g.add_argument("--max-nodes", type=_positive, metavar="N",
                   help="most nodes in one prompt (default 10000)")
    g.add_argument("--max-batch-pixels", type=_positive, metavar="N",
                   help="most batch_size x width x height of one node (default 2**30)")
    g.add_argument("--body-timeout", type=float, metavar="S",
                   help="seconds a request body may take to arrive (default 30)")
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run prompts on Ray workers (needs mixgraph[ray]); no ADDRESS: start a "
                        "local Ray instance")
    p.add_argument("--workers", type=_positive, metavar="N",
                   help="with --ray: how many workers (default one per GPU, else per machine)")
    p.add_argument("--fan-out", action="store_true",
                   help="with --ray: split a prompt's batch or list (seeds, prompts) over idle "
                        "workers when the images stay the same (per prompt: extra_data "
                        "mixgraph_fan_out)")
    add_cache_flags(p)
    add_memory_flag(p)
    _common(p)
    add_comfy_flags(p)  # ComfyUI's own server flags (ui/comfy/comfy_flags.py), --base-directory too
    _custom_nodes(p, base_directory=False)

    from mixgraph.ui.demo import help_text
    p = sub.add_parser("demo", help="run the default workflow on the embedded model", description=help_text())
    p.add_argument("--prompt", metavar="TEXT", help="what to draw (default: a blue circle on a yellow background)")
    p.add_argument("--seed", type=int, metavar="N", help="noise seed (default 42)")
    p.add_argument("--output", metavar="DIR")
    p.add_argument("--device", metavar="D")
    _common(p)

    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench", required=True, metavar="WHAT")
    b = bsub.add_parser("engine", help="engine overhead on 1,000-node graphs of trivial nodes")
    b.add_argument("--json", action="store_true")
    b.add_argument("--nodes", type=int, default=1000, help="graph size (default 1000)")
    b.add_argument("--big", type=int, default=100_000, help="size of the long-chain check (0: skip)")
    b.add_argument("--repeat", type=int, default=5)
    b.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",") if x],
                   help="also time these graph sizes, e.g. 1000,10000,100000")
    _common(b)
    b = bsub.add_parser("precision", help="a workflow under each precision")
    b.add_argument("workflow", metavar="WF.json")
    b.add_argument("--precisions", metavar="LIST")
    b.add_argument("--json", action="store_true")
    b.add_argument("--output", metavar="DIR")
    b.add_argument("--device", metavar="D")
    _common(b)
    return parser


def main(argv: Sequence[str] | None = None, registry: Any = None) -> int:
    """Entry point; `registry` lets tests run the CLI in-process on their own nodes."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return int(e.code or 0)
    try:
        if getattr(args, "memory_budget", None) is not None:
            from mixgraph.nodes.models.memory_budget import set_budget
            set_budget(getattr(args, "device", None) or "cpu", args.memory_budget)
        if args.command == "run":
            return _cmd_run(args, registry)
        if args.command == "validate":
            return _cmd_validate(args, registry)
        if args.command == "nodes" and args.system:
            from mixgraph.ui.estimate import system_section
            print(json.dumps(system_section(args.device or "cpu"), indent=1))
            return EXIT_OK
        if args.command == "nodes":
            return _cmd_nodes(args, registry)
        if args.command == "estimate":
            from mixgraph.ui.estimate import cli_main
            return int(cli_main(args, _registry(registry, args)) or 0)
        if args.command == "bench" and args.bench == "engine":
            from mixgraph.ui.bench.bench_engine import cli_main
            return int(cli_main(args) or 0)
        if args.command == "bench":
            from mixgraph.ui.bench.bench_precision import cli_main
            return int(cli_main(args) or 0)
        if args.command == "serve":
            from mixgraph.graph.validate import gc_paused
            with gc_paused():    # start-up's objects live on: no collector passes over them
                from mixgraph.ui.server.server import cli_main
            return int(cli_main(args) or 0)
        if args.command == "demo":
            from mixgraph.ui.demo import cli_main
            return int(cli_main(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `mixgraph nodes | head`: the reader left; stop quietly
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_NODE_FAILED
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    parser.error(f"unknown command {args.command!r}")
    return EXIT_INVALID


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_INVALID):
        super().__init__(message)
        self.code = code


def _registry(registry: Any, args: argparse.Namespace | None = None) -> Any:
    """The registry (the node library unless given), with the custom node packs the arguments
    name; a pack that fails to import is reported on stderr and skipped."""
    env = _env(args) if args is not None else None    # a bad --models refused before the import
    if registry is None:
        from mixgraph.ui.api import default_registry
        try:
            registry = default_registry()
        except Exception as e:  # noqa: BLE001 - a broken install: say so, run nothing
            raise CliError(f"the node library failed to load ({type(e).__name__}: {e})") from e
    if args is not None:
        from mixgraph.ui.comfy.custom_nodes import load_from_args
        for line in load_from_args(args, registry, env).messages():
            print(f"warning: {line}", file=sys.stderr)
    return registry


def _env(args: argparse.Namespace):
    """The run's folders; CliError for a --models folder (or MIXGRAPH_MODELS) that is not one."""
    from mixgraph.graph.env import Env, models_problem
    problem = models_problem(args.models)
    if problem:
        raise CliError(problem)
    return Env.from_args(models=args.models, input=args.input, output=getattr(args, "output", None),
                         device=getattr(args, "device", None))


def _check_writable(output: Path, report: str | None) -> None:
    """Refuse, before anything runs, an output folder or report file that cannot be written:
    OutputFolderError naming the path and why."""
    from mixgraph.graph.env import OutputFolderError, folder_problem
    problem = folder_problem(output, "output folder")
    if problem is None and report:
        if Path(report).is_dir():
            problem = f"--report {report} is a folder; give a file name"
        else:
            problem = folder_problem(Path(report).parent, "folder of --report")
    if problem:
        raise OutputFolderError(problem)


def _cmd_run(args: argparse.Namespace, registry: Any) -> int:
    from mixgraph.ui.api import load_file, set_inputs
    from mixgraph.graph.executor import Executor, Interrupted, NodeError, ValidationFailed
    from mixgraph.graph.env import writable_folder
    from mixgraph.graph.precision import PrecisionError, parse_precision_arg
    from mixgraph.graph.prompt import WorkflowError

    problem = check_device(args.device)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_INVALID
    registry = _registry(registry, args)
    env = _env(args)
    try:
        parse_precision_arg(args.precision, env.device)
    except PrecisionError as e:
        print(f"error: --precision: {e}", file=sys.stderr)
        return EXIT_INVALID
    try:
        wf = set_inputs(load_file(args.workflow, registry), args.set)
        _check_writable(env.output, args.report)
    except (WorkflowError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    try:
        cache = cache_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    # validate first: a value out of range is said at once, and only a valid workflow is
    # estimated (tracing an absurd size would take minutes only to answer "not enough memory")
    from mixgraph.graph.validate import validate
    v = validate(wf.prompt, registry, env)
    if v.clean:
        from mixgraph.ui.estimate import refusal, size_refusal
        # a tensor alone over the memory budget first: milliseconds, no tracing
        problem = size_refusal(wf, registry, env, order=v.order) or \
            refusal(wf, registry, env, args.precision, order=v.order)
        if problem:     # refused before it runs, rather than killed by the OOM killer mid-run
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_INVALID
    from mixgraph.ui.progress import ProgressBar
    from mixgraph.nodes.weights import streaming
    bar = ProgressBar(disable=args.quiet)
    streamed_before = streaming.snapshot()
    report = None
    code = EXIT_OK
    try:
        report = Executor(registry, env, cache).run(wf, precision=args.precision, on_event=bar,
                                                    validation=v)
    except ValidationFailed as e:
        print(f"invalid workflow {args.workflow}:\n{e}", file=sys.stderr)
        report, code = e.report, EXIT_INVALID
    except NodeError as e:
        bar.close()
        print(f"error: {e}", file=sys.stderr)
        report, code = e.report, EXIT_NODE_FAILED
    except Interrupted as e:
        bar.close()
        print("interrupted", file=sys.stderr)
        report, code = e.report, EXIT_INTERRUPTED
    finally:
        bar.close()
    streamed = streaming.since(streamed_before)
    if args.report and report is not None:
        try:
            writable_folder(Path(args.report).parent, "report folder")
            body = report.to_json()
            body["memory"] = memory_report(getattr(args, "device", None) or "cpu", streamed)
            Path(args.report).write_text(json.dumps(body, indent=2))
        except OSError as e:
            print(f"error: cannot write the report {args.report}: {e.strerror or e}",
                  file=sys.stderr)
            code = code or EXIT_NODE_FAILED
    if report is not None and code == EXIT_OK:
        for path in report.files:
            print(path)
        cached = len(report.cached)
        print(f"done in {report.seconds:.2f} s: {len(report.executed)} node(s) executed"
              + (f", {cached} cached" if cached else ""), file=sys.stderr)
        if streamed["models"] or streamed["loads"]:
            print(streaming_line(streamed), file=sys.stderr)
    return code


def memory_report(device: str, streamed: dict) -> dict:
    """The run report's ``memory`` section: the budget in force and what streaming cost."""
    from mixgraph.nodes.weights.streaming import memory_section
    return memory_section(device, streamed)


def streaming_line(s: dict) -> str:
    """One line saying what weight streaming cost in a run (``streaming.since``)."""
    def size(n: float) -> str:
        return f"{n / 2**30:.2f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"

    line = (f"streamed {s['models']} model(s) within the memory budget: {size(s['bytes_streamed'])} "
            f"read in {s['load_seconds']:.2f} s over {s['passes']} pass(es)")
    if s.get("passes"):
        line += f" ({size(s['bytes_per_pass'])}, {s['seconds_per_pass']:.2f} s per pass)"
    return line + f"; peak weights held {size(s['peak_weight_bytes'])}"


def _cmd_validate(args: argparse.Namespace, registry: Any) -> int:
    from mixgraph.graph.prompt import WorkflowError
    from mixgraph.graph.validate import format_problems
    from mixgraph.ui.api import validate_file

    registry = _registry(registry, args)
    env = _env(args)
    try:
        wf, v = validate_file(args.workflow, registry, env)
    except (WorkflowError, OSError) as e:
        if args.json:
            print(json.dumps({"error": {"type": getattr(e, "error_type", "invalid_prompt"),
                                        "message": str(e), "details": "", "extra_info": {}},
                              "node_errors": {}}, indent=2))
        else:
            print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    ok = v.clean
    if ok:          # a tensor alone over the memory budget (milliseconds: no estimate)
        from mixgraph.ui.estimate import size_refusal
        problem = size_refusal(wf, registry, env, order=v.order)
        if problem:
            if args.json:
                print(json.dumps({"error": {"type": "insufficient_memory", "message": problem,
                                            "details": "", "extra_info": {}}, "node_errors": {}},
                                 indent=2))
            else:
                print(f"error: {problem}", file=sys.stderr)
            return EXIT_INVALID
    if args.json:
        body = {"outputs": list(v.outputs), "node_errors": {}} if ok else \
            {"error": v.error, "node_errors": v.node_errors}
        if ok:      # the memory estimate, for workflows that load models
            from mixgraph.ui.estimate import memory_section
            memory = memory_section(wf, registry, env, order=v.order)
            if memory.get("weights_bytes"):
                body["memory"] = memory
        print(json.dumps(body, indent=2))
    elif ok:
        print(f"{args.workflow}: valid ({len(wf.prompt)} nodes; outputs {', '.join(v.outputs)})")
    else:
        print(format_problems(v), file=sys.stderr)
    return EXIT_OK if ok else EXIT_INVALID


def _cmd_nodes(args: argparse.Namespace, registry: Any) -> int:
    registry = _registry(registry, args)
    env = _env(args)
    info = registry.object_info(env)
    if args.json:
        print(json.dumps(info, indent=1, sort_keys=True, default=str))
        return EXIT_OK
    by_cat: dict[str, list[str]] = {}
    for name, entry in info.items():
        ins = ", ".join([*entry.get("input_order", {}).get("required", []),
                         *(f"[{n}]" for n in entry.get("input_order", {}).get("optional", []))])
        outs = ", ".join(entry.get("output", []))
        by_cat.setdefault(entry.get("category") or "(none)", []).append(f"  {name}({ins}) -> {outs}")
    for cat in sorted(by_cat):
        print(cat)
        print("\n".join(sorted(by_cat[cat])))
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
