"""`flotilla sim`: replay a trace or a synthetic workload through simulated replicas."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable

from fake_engines.factory.vllm_config import max_model_len_arg
from flotilla.cli_errors import positive_int

HELP = "simulate a fleet under a virtual clock and compare routing policies on identical arrivals"
SUBCOMMANDS = {"sweep": "flotilla.sim_sweep_cmd"}
"""`flotilla sim sweep GRID.yaml`: a grid of these runs in parallel (flotilla.cli dispatches)."""
DESCRIPTION = """\
Run a workload through N simulated replicas with the real engine core, the real perf model and
the real routing policies under a virtual clock. Several --policy values run on the same
arrivals and print one comparison table; --json prints every run in the loadgen result schema.

examples:
  flotilla sim --trace tests/data/seed/example9.jsonl --engine fixed --replicas 3 \\
      --policy round-robin --policy least-outstanding
  flotilla sim --trace tests/data/seed/example16.jsonl --engine vllm --replicas 4 \\
      --block-size 8 --num-gpu-blocks-override 100000 --policy session-affinity:home=modulo
  flotilla sim --fleet proxy/fleet.default.yaml --synthetic poisson:rate=0.2,duration=500,system=1000 \\
      --policy prefix-aware --policy prefix-capacity

`flotilla sim sweep GRID.yaml [--workers N | --ray ADDRESS]` runs the cross product of values of
these flags in parallel (flotilla sim sweep --help, docs/autoscaling.md#sweeps).
"""

# flags, spelled as fake-vllm serve / fake-llama-server spell them -> (scheduler config field,
# type, engine kinds it applies to)
ENGINE_FLAGS: dict[tuple[str, ...], tuple[str, Callable[[str], object], tuple[str, ...]]] = {
    ("--block-size",): ("block_size", int, ("vllm",)),
    ("--max-num-seqs",): ("max_num_seqs", int, ("vllm",)),
    ("--max-num-batched-tokens",): ("max_num_batched_tokens", int, ("vllm",)),
    ("--max-model-len",): ("max_model_len", max_model_len_arg, ("vllm",)),
    ("--max-loras",): ("max_loras", int, ("vllm",)),
    ("--enable-prefix-caching",): ("enable_prefix_caching", bool, ("vllm",)),
    ("--prefix-caching-hash-algo",): ("prefix_caching_hash_algo", str, ("vllm",)),
    ("-c", "--ctx-size"): ("n_ctx", int, ("llamacpp",)),
    ("-np", "--parallel"): ("n_parallel", int, ("llamacpp",)),
    ("-b", "--batch-size"): ("n_batch", int, ("llamacpp",)),
    ("-ub", "--ubatch-size"): ("n_ubatch", int, ("llamacpp",)),
    ("--slot-prompt-similarity", "-sps"): ("slot_prompt_similarity", float, ("llamacpp",)),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", metavar="FILE", help="trace file (Mooncake, Azure, BurstGPT or Flotilla JSONL)")
    src.add_argument("--synthetic", metavar="SPEC", help="synthetic workload, e.g. agents:sessions=6,turns=5,system=2000")
    p.add_argument("--format", help="trace format when it cannot be recognised from the file")
    p.add_argument("--max-requests", type=int, help="stop after this many requests of the workload")
    p.add_argument("--replicas", type=positive_int, default=4, help="engine replicas behind the router (default 4)")
    p.add_argument("--fleet", metavar="FILE", help="the fleet of a `flotilla up` fleet file (its engines, weighed as "
                   "it weighs them, its autoscaler, SLO and scrape interval) instead of --replicas copies of "
                   "--engine; --policy, --autoscale, --slo and --scrape-interval override the file's")
    p.add_argument("--engine", choices=("vllm", "llamacpp", "fixed"), default="vllm",
                   help="engine model: full vLLM, full llama.cpp, or fixed (one request at a time for "
                        "the trace's service_time_s)")
    p.add_argument("--model", default="llama-3.1-8b", help="catalogue model (default llama-3.1-8b)")
    p.add_argument("--gpu", default="h100", help="catalogue GPU (default h100)")
    p.add_argument("--catalogue", action="append", default=[], metavar="FILE", help="extra catalogue YAML")
    p.add_argument("--quant", metavar="TYPE", help="llamacpp: GGUF quantisation of --model (Q4_K_M, Q8_0, F16, ...), "
                                                  "as fake-llama-server serves <model>-<quant>.gguf; default: 16-bit")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, dest="tp", help="tensor-parallel size")
    p.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1, dest="pp", help="pipeline stages")
    p.add_argument("--link", default="nvlink", help="link between the GPUs of one replica (default nvlink)")
    p.add_argument("--num-gpu-blocks-override", type=int, help="vLLM KV blocks instead of the capacity model's")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM share of GPU memory")
    for flags, (field, typ, kinds) in ENGINE_FLAGS.items():
        kind = {"action": argparse.BooleanOptionalAction} if typ is bool else {"type": typ}
        p.add_argument(*flags, **kind, dest=f"eng_{field}", help=f"{'/'.join(kinds)} {field}")
    p.add_argument("--policy", action="append", metavar="SPEC",
                   help="routing policy NAME[:key=value,...]; repeat to compare (default round-robin)")
    p.add_argument("--autoscale", action="append", default=[], metavar="SPEC",
                   help="scaling policy NAME[:key=value,...] (seed, target-tracking, kpa, cold-start-aware, ...), "
                        "or none for the fixed fleet; the fleet starts with --replicas and scales; repeat to "
                        "compare on the same arrivals")
    p.add_argument("--no-autoscale", action="store_true",
                   help="with --fleet: keep the fleet at its starting size, without the file's autoscaler")
    p.add_argument("--cold-start", type=float, metavar="S",
                   help="seconds from launching a replica to its first request (default: startup 20 s + "
                        "weights at 3 GB/s + warm-up 40 s, the seed's Example 17)")
    p.add_argument("--scrape-interval", type=float, metavar="S",
                   help="policies see engine metrics only as fresh as this scrape interval")
    p.add_argument("--kv-events-delay", type=float, metavar="SECONDS",
                   help="a policy that reads the engines' KV events (precise-prefix) gets each engine step's "
                        "events this long after the step ends, in virtual time (default 0.005)")
    pd = p.add_argument_group("disaggregated prefill/decode (docs/pd.md)")
    pd.add_argument("--prefill-replicas", type=positive_int, metavar="N",
                    help="a P/D fleet: N prefill replicas of --engine vllm (with --decode-replicas); it runs "
                         "beside a colocated fleet of the same GPU count on the same arrivals")
    pd.add_argument("--decode-replicas", type=positive_int, metavar="M", help="a P/D fleet: M decode replicas")
    pd.add_argument("--prefill-policy", metavar="SPEC", help="routing policy of the prefill pool (default prefix-aware)")
    pd.add_argument("--decode-policy", metavar="SPEC", help="routing policy of the decode pool (default least-load)")
    pd.add_argument("--kv-link", action="append", default=[], metavar="LINK",
                    help="link each decode replica pulls KV over: nvlink, ib400, roce400, pcie5, pcie4, eth100 "
                         "(default ib400); repeat to compare")
    pd.add_argument("--prefill-autoscale", metavar="SPEC",
                    help="scaling policy of the prefill pool (e.g. pd-prefill); default: fixed")
    pd.add_argument("--decode-autoscale", metavar="SPEC",
                    help="scaling policy of the decode pool (e.g. pd-decode); default: fixed")
    pd.add_argument("--colocated-replicas", type=int, metavar="K",
                    help="replicas of the colocated fleet beside the P/D one (default: the same GPU count; "
                         "0: none); it routes with the first --policy (default least-load)")
    p.add_argument("--slo", help="goodput SLOs, e.g. ttft=0.5,tpot=0.05")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print every run as loadgen result JSON")
    p.add_argument("--output", metavar="PREFIX", help="also write PREFIX-<policy>.json (.csv) per run, in --output-format")
    from flotilla.loadgen_cmd import add_result_options

    add_result_options(p)
    p.add_argument("--plot", metavar="PNG", help="write latency CDFs of the runs and their replicas against "
                                                  "the arrival rate to this PNG")
    p.add_argument("--pareto", metavar="PNG", help="write GPU-seconds against SLO attainment of the runs to this PNG")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar per run on stderr (default: when stderr is a terminal)")


def _workload(args: argparse.Namespace, runs: int):  # type: ignore[no-untyped-def]
    import itertools

    from tqdm import tqdm

    show = args.progress if args.progress is not None else sys.stderr.isatty()
    started = itertools.count(1)

    def requests() -> Iterable:  # type: ignore[type-arg]
        if args.trace:
            from loadgen.readers import read_trace
            reqs = read_trace(args.trace, args.format)
        else:
            from loadgen.synthetic import synthetic_requests
            reqs = synthetic_requests(args.synthetic, seed=args.seed)
        return itertools.islice(reqs, args.max_requests) if args.max_requests else reqs

    # the bar's total (for its ETA): the workload counted once, only when a bar is shown
    total = sum(1 for _ in requests()) if show else None

    def load() -> Iterable:  # type: ignore[type-arg]
        # arrivals are drawn as virtual time reaches them, so the bar follows the simulation
        return tqdm(requests(), desc=f"run {next(started)}/{runs}", unit="req", total=total,
                    disable=not show, mininterval=0.5, file=sys.stderr)
    return load


def _spec(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from fake_engines.perf.batch import Layout
    from sim.build import EngineSpec

    sched = {field: getattr(args, f"eng_{field}") for field, _, kinds in ENGINE_FLAGS.values()
             if args.engine in kinds and getattr(args, f"eng_{field}") is not None}
    return EngineSpec(kind=args.engine, model=args.model, gpu=args.gpu,
                      layout=Layout(tp=args.tp, pp=args.pp, link=args.link), scheduler=sched,
                      num_gpu_blocks_override=args.num_gpu_blocks_override,
                      gpu_memory_utilization=args.gpu_memory_utilization,
                      catalogue_files=tuple(args.catalogue), quant=args.quant)


def _fleet(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The fleet of --fleet (flotilla.fleet.Fleet), or None."""
    if not args.fleet:
        return None
    from flotilla.fleet import load_fleet_file

    return load_fleet_file(args.fleet)


def _settings(args: argparse.Namespace, fleet) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """Routing and scaling policies, SLO and scrape interval: the flags, else the fleet file's."""
    from loadgen.stats import parse_slo
    from proxy.autoscale.config import AutoscaleConfig

    scaling = args.autoscale
    if args.no_autoscale and scaling:
        raise ValueError("--no-autoscale and --autoscale: choose one")
    if not scaling and not args.no_autoscale and fleet is not None and fleet.autoscaler is not None:
        scaling = [fleet.autoscaler.policy or AutoscaleConfig.policy]
    return {"policies": args.policy or ([fleet.policy] if fleet else ["round-robin"]), "autoscale": scaling,
            "slo": parse_slo(args.slo) if args.slo else (fleet.slo if fleet else None),
            "scrape_interval_s": args.scrape_interval or (fleet.scrape_interval_s if fleet else None)}


def simulate_args(args: argparse.Namespace) -> list:  # type: ignore[type-arg]
    """Every run `flotilla sim ARGS` asks for, as RunResults: the one code path of a single
    `flotilla sim` and of each cell of `flotilla sim sweep` (sim/sweep.py)."""
    from sim.build import fleet_replicas
    from sim.run import compare

    if args.prefill_replicas or args.decode_replicas:
        return _simulate_pd(args)
    fleet = _fleet(args)
    if fleet is not None and any(g.role for g in fleet.engines):
        return _simulate_pd_fleet(args, fleet)
    s = _settings(args, fleet)
    runs = len(s["policies"]) * max(1, len(s["autoscale"]))
    delay = {} if args.kv_events_delay is None else {"kv_events_delay_s": args.kv_events_delay}
    return compare(_workload(args, runs), _spec(args), args.replicas, s["policies"], args.seed,
                   s["scrape_interval_s"], s["slo"], s["autoscale"], args.cold_start,
                   fleet_replicas(fleet) if fleet else None, **delay)


def _simulate_pd(args: argparse.Namespace) -> list:  # type: ignore[type-arg]
    """`--prefill-replicas N --decode-replicas M`: the colocated fleet and one P/D fleet per --kv-link."""
    from loadgen.stats import parse_slo
    from sim.pd import DEFAULT_DECODE_POLICY, DEFAULT_PREFILL_POLICY, PdFleet, compare_pd

    if not (args.prefill_replicas and args.decode_replicas):
        raise ValueError("a P/D fleet needs both --prefill-replicas and --decode-replicas")
    if args.fleet:
        raise ValueError("--fleet and --prefill-replicas/--decode-replicas: choose one")
    links = args.kv_link or ["ib400"]
    fleets = [PdFleet(args.prefill_replicas, args.decode_replicas, args.prefill_policy or DEFAULT_PREFILL_POLICY,
                      args.decode_policy or DEFAULT_DECODE_POLICY, link, args.prefill_autoscale,
                      args.decode_autoscale) for link in links]
    colocated = (args.prefill_replicas + args.decode_replicas if args.colocated_replicas is None
                 else args.colocated_replicas)
    runs = len(fleets) + (1 if colocated else 0)
    return compare_pd(_workload(args, runs), _spec(args), fleets, colocated,
                      (args.policy or [DEFAULT_DECODE_POLICY])[0], args.seed,
                      parse_slo(args.slo) if args.slo else None, args.scrape_interval)


def _simulate_pd_fleet(args: argparse.Namespace, fleet) -> list:  # type: ignore[no-untyped-def,type-arg]
    """`--fleet` with role: prefill and role: decode groups: the P/D fleet (per --kv-link) beside a
    colocated fleet of the decode group's engine on as many GPUs (--colocated-replicas)."""
    import dataclasses

    from fake_engines.perf.batch import Layout
    from loadgen.stats import parse_slo
    from sim.pd import DEFAULT_DECODE_POLICY, compare_pd, fleet_file_pd

    runs = fleet_file_pd(fleet, args.prefill_policy, args.decode_policy, args.kv_link)
    prefill, decode = runs[0][0]
    gpus_each = decode.tensor_parallel * decode.pipeline_parallel
    gpus = sum(g.replicas * g.tensor_parallel * g.pipeline_parallel for g in (prefill, decode))
    colocated = gpus // gpus_each if args.colocated_replicas is None else args.colocated_replicas
    spec = dataclasses.replace(_spec(args), model=decode.model, gpu=decode.gpu,
                               layout=Layout(tp=decode.tensor_parallel, pp=decode.pipeline_parallel))
    slo = parse_slo(args.slo) if args.slo else fleet.slo
    return compare_pd(_workload(args, len(runs) + (1 if colocated else 0)), spec, runs, colocated,
                      (args.policy or [DEFAULT_DECODE_POLICY])[0], args.seed, slo,
                      args.scrape_interval or fleet.scrape_interval_s)


def _result_options(args: argparse.Namespace) -> tuple[tuple[float, ...], tuple[str, ...]]:
    from loadgen.export import parse_percentile_metrics
    from loadgen.stats import parse_percentiles

    return parse_percentiles(args.percentiles), parse_percentile_metrics(args.percentile_metrics)


def _provenance(args: argparse.Namespace) -> dict[str, object]:
    """When, by which Flotilla and command, on which trace, in which clock (virtual: no time
    scale), for which model: the meta every run of this command gains."""
    from loadgen.provenance import run_meta

    return {**run_meta(args.trace, getattr(args, "argv", None)), "time_base": "virtual", "time_scale": None, "model": args.model}


def _with_provenance(result, provenance: dict[str, object]):  # type: ignore[no-untyped-def]
    """`result` with `provenance` added to its meta (keys the run set itself kept)."""
    import dataclasses

    return dataclasses.replace(result, meta={**provenance, **result.meta})


def run(args: argparse.Namespace) -> int:
    from fake_engines.factory import ModelDoesNotFit
    from loadgen.stats import with_percentiles
    from sim.report import comparison_table

    try:
        percentiles, metrics = _result_options(args)
        results = [with_percentiles(r, percentiles) for r in simulate_args(args)]
    except (ValueError, KeyError, OSError, ModelDoesNotFit) as exc:  # a bad trace or flag: one line, no traceback
        print(f"flotilla sim: error: {exc}", file=sys.stderr)
        return 2
    if args.output:
        from loadgen.export import write_result

        suffix = ".csv" if args.output_format == "csv" else ".json"
        # files record how they were made; --json stays the same bytes for the same command (a
        # `flotilla sim sweep` cell is compared with it)
        provenance = _provenance(args)
        for r in results:
            name = f"{args.output}-{r.label.replace(':', '_').replace(',', '_')}{suffix}"
            write_result(_with_provenance(r, provenance), name, args.output_format or "json", metrics)
    if args.plot:
        from loadgen.plots import plot_runs
        plot_runs(results, args.plot)
    if args.pareto:
        from loadgen.plots import plot_pareto
        plot_pareto(results, args.pareto)
    if args.json:
        json.dump({"runs": [r.to_json() for r in results]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif results and any("pd" in r.meta for r in results):
        from sim.report import pd_table
        print(pd_table(results))
    else:
        print(comparison_table(results))
    return 0
