"""grpokit vs TRL's GRPOTrainer, side by side: speed, memory, model-FLOPs utilization.

    make bench                                    # the two comparisons below
    python bench/bench_vs_trl.py --quick          # tiny: checks that the script works (minutes)
    python bench/bench_vs_trl.py --scaling        # + G ∈ {4, 8, 16} × max new tokens ∈ {64, 128, 256}

Each run is its own process, peers alternating (TRL, grpokit, TRL, grpokit, ...): grpokit in this
interpreter's venv (``.venv``), TRL 1.16.0 in ``.venv-bench`` (``make bench`` creates it). Both do
the same work: SmolLM2-135M-Instruct (the cached grpokit folder), GSM8K train prompts with the chat
template in grpokit's order, G = 8 completions for each of B = 4 prompts, at most 64 new tokens,
temperature 1, β = 0.04 (a reference model), μ = 1, reward ``math_correct``, micro-batches of 8
sequences, ``--steps`` optimizer steps of which the first is discarded.

Comparisons:
  (a) same precision: fp32 both, no gradient checkpointing;
  (b) each at its fastest setting on this CPU (``--grpokit-fast``, ``--trl-fast``); grpokit's fast
      setting is checked against its plain fp32 path on the same batch (loss, log-prob and
      gradient differences printed).

Printed per run: median seconds per optimizer step; seconds in generation / no-grad log-prob
passes (π_ref) / train (policy forward with grad + backward + optimizer); generated tokens per
second of generation; mean completion length; peak resident memory (the child's own ``ru_maxrss``,
taken before grpokit's parity check); training model-FLOPs utilization

    MFU = (6 · N_body · D + 6 · V · d · C) / train_s / peak

with N_body the parameters outside the (tied) embedding / LM head (``n_params − V·d``), D the
non-padding tokens the training forward/backward actually ran (grpokit runs a shared prompt once
per group), C the completion tokens whose logits it computed (the LM head runs only there),
train_s the policy forward with grad + backward + optimizer seconds, and peak this machine's torch
matmul rate for the run's precision (fp32, or bf16 for bf16 settings), measured before and after
the runs with the same thread count (the higher is used; a busy machine measures low). Attention's
quadratic FLOPs are left out (the figure is conservative). ``MFU_seq`` uses D = Σ rows (prompt +
completion tokens), the work of the unshared formulation as TRL runs it: a throughput figure on a
common basis, which can exceed 100% when work is shared.

Results: ``bench/results/<time>-<run>.json`` per run and ``bench/results/<time>-summary.json``;
a markdown report on stdout. The machine may be shared: load averages are recorded before and
after each run; ``--threads`` sets OMP_NUM_THREADS for every child (on a busy 2-core machine one
thread avoids OpenMP threads waiting on a descheduled sibling).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGETS = {"same_precision_step": 0.5, "fastest_step": 0.25, "memory": 0.33, "mfu": 0.5}
VOCAB, HIDDEN = 49152, 576  # SmolLM2-135M: its LM head is the (tied) embedding, V·d parameters


# -- running children --------------------------------------------------------------------------


def run_child(cmd: list[str], *, env: dict, time_cap: float, mem_cap_gb: float, log_path: Path) -> dict:
    """Run ``cmd``; kill it past ``time_cap`` seconds or ``mem_cap_gb`` resident. Returns status,
    wall seconds and the psutil-polled peak RSS (the child and its children)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        psutil = None
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        os.set_blocking(proc.stdout.fileno(), False)
        peak, status = 0, None
        ps = psutil.Process(proc.pid) if psutil else None
        while True:
            line = proc.stdout.readline()
            while line:
                log.write(line)
                for part in line.split("\r"):
                    if (
                        ("[grpokit " in part or "[trl " in part)
                        and ("step" in part or "parity" in part)
                        or "Error" in part
                    ):
                        print(
                            "   ",
                            part[part.find("[") :].rstrip()[:240] if "[" in part else part.rstrip()[:240],
                            flush=True,
                        )
                line = proc.stdout.readline()
            if proc.poll() is not None:
                break
            if ps is not None:
                try:
                    rss = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
                    peak = max(peak, rss)
                except psutil.Error:
                    pass
            if time.perf_counter() - t0 > time_cap:
                status = f"timeout (> {time_cap:.0f} s)"
            elif peak > mem_cap_gb * 1024**3:
                status = f"memory cap (> {mem_cap_gb:.0f} GB RSS)"
            if status:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.2)
        rest = proc.stdout.read() or ""
        log.write(rest)
    rc = proc.returncode
    if status is None:
        status = "ok" if rc == 0 else ("killed (out of memory?)" if rc in (-9, 137) else f"failed (exit {rc})")
    return {"status": status, "wall_s": time.perf_counter() - t0, "polled_peak_rss_gb": peak / 1024**3}


def child_cmd(peer: str, python: str, out: Path, cfg: dict) -> list[str]:
    script = HERE / ("run_grpokit.py" if peer == "grpokit" else "run_trl.py")
    cmd = [
        python,
        str(script),
        "--out",
        str(out),
        "--G",
        str(cfg["G"]),
        "--B",
        str(cfg["B"]),
        "--max-new-tokens",
        str(cfg["T"]),
        "--steps",
        str(cfg["steps"]),
        "--micro-batch-size",
        str(cfg["mbs"]),
        "--precision",
        cfg["precision"],
    ]
    return cmd + cfg.get("extra", [])


def setting_args(spec: str) -> tuple[str, list[str]]:
    """``"bf16_autocast+bf16sampler"`` -> precision and extra child flags."""
    precision, *flags = spec.split("+")
    extra = {"bf16sampler": "--bf16-sampler", "plain": "--plain", "parity": "--parity"}
    return precision, [extra[f] for f in flags]


# -- summarizing -------------------------------------------------------------------------------


def summarize(res: dict, peak: dict) -> dict:
    """Medians over the measured steps (the first step is discarded when there are two or more)."""
    steps = res.get("steps") or []
    meas = steps[1:] if len(steps) > 1 else steps
    if not meas:
        return {}
    med = lambda k: statistics.median(s[k] for s in meas)  # noqa: E731
    tot = lambda k: sum(s[k] for s in meas)  # noqa: E731
    prec_peak = peak["bf16" if res["setting"].startswith("bf16") else "fp32"]["peak_gflops"] * 1e9
    train_s = max(tot("train_s"), 1e-9)
    head = res.get("lm_head_params") or VOCAB * HIDDEN  # V·d of SmolLM2-135M (tied embeddings)
    body = res["n_params"] - head
    head_flops = 6 * head * tot("completion_tokens")
    return {
        "step_s": med("step_s"),
        "gen_s": med("gen_s"),
        "logp_ref_s": med("logp_ref_s"),
        "train_s": med("train_s"),
        "gen_tok_s": tot("completion_tokens") / max(tot("gen_s"), 1e-9),
        "completion_len": statistics.mean(s["completion_len_mean"] for s in meas),
        "peak_rss_gb": res["peak_rss_gb"],
        "mfu": (6 * body * tot("train_tokens") + head_flops) / train_s / prec_peak,
        "mfu_seq": (6 * body * tot("sequence_tokens") + head_flops) / train_s / prec_peak,
        "train_tokens": tot("train_tokens") / len(meas),
        "sequence_tokens": tot("sequence_tokens") / len(meas),
        "measured_steps": len(meas),
    }


def fmt(x, spec=".2f"):
    return "—" if x is None else format(x, spec)


def run_table(rows: list[dict]) -> str:
    head = (
        "| peer | setting | s/step (median) | gen s | logp+ref s | train s | gen tok/s | mean len | "
        "peak RSS GB | MFU | MFU_seq | load avg (1 min, before→after) | status |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        s = r.get("summary") or {}
        out.append(
            f"| {r['peer']} | {r['setting']} | {fmt(s.get('step_s'))} | {fmt(s.get('gen_s'))} | "
            f"{fmt(s.get('logp_ref_s'))} | {fmt(s.get('train_s'))} | {fmt(s.get('gen_tok_s'), '.1f')} | "
            f"{fmt(s.get('completion_len'), '.1f')} | {fmt(s.get('peak_rss_gb') or r.get('polled_peak_rss_gb'))} | "
            f"{fmt(s.get('mfu') and 100 * s['mfu'], '.1f')}% | "
            f"{fmt(s.get('mfu_seq') and 100 * s['mfu_seq'], '.1f')}% | "
            f"{r.get('load_before', '—')}→{r.get('load_after', '—')} | {r['status']} |"
        )
    return "\n".join(out)


def ratio(a, b):
    return None if not a or not b else a / b


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--quick", action="store_true", help="tiny workload, 1 measured step: checks the script works")
    ap.add_argument("--scaling", action="store_true", help="also the G × max-new-tokens grid (fp32 both)")
    ap.add_argument("--scaling-only", action="store_true", help="only the grid")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per run; the first is discarded")
    ap.add_argument("--scaling-steps", type=int, default=2, help="steps per grid run (1 = no warm-up step discarded)")
    ap.add_argument(
        "--grid", default="4x64,4x128,4x256,8x64,8x128,8x256,16x64,16x128,16x256", help="the scaling grid as GxT pairs"
    )
    ap.add_argument("--repeats", type=int, default=1, help="alternate each pair of runs this many times")
    ap.add_argument("--time-cap", type=float, default=1800, help="seconds per run before it is killed")
    ap.add_argument("--scaling-time-cap", type=float, default=900)
    ap.add_argument(
        "--mem-cap-gb",
        type=float,
        default=None,
        help="RSS per run before it is killed (default: 85%% of this machine's memory)",
    )
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for every child (default: unset)")
    ap.add_argument(
        "--grpokit-fast",
        default="bf16",
        help="grpokit's fastest setting: fp32 | "
        "bf16_autocast | bf16 (bf16 parameters, torchao AdamW with stochastic rounding); "
        "'+bf16sampler' = sample from a bf16 copy of the policy; '+plain' = "
        "no prompt sharing / static cache",
    )
    ap.add_argument("--trl-fast", default="bf16_autocast", help="TRL's fastest setting: fp32 | bf16_autocast | bf16")
    ap.add_argument("--only", choices=["grpokit", "trl"], help="run one peer only")
    ap.add_argument("--grpokit-python", default=sys.executable)
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    ap.add_argument("--results", default=str(HERE / "results"))
    ap.add_argument("--rerender", metavar="SUMMARY_JSON", help="print the report of a saved run again and exit")
    ap.add_argument("--peak-json", help="with --rerender: use this peak_flops.py output")
    a = ap.parse_args()
    if a.rerender:
        return rerender(a.rerender, a.peak_json)

    results = Path(a.results)
    results.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    if a.threads:
        env.update(OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    if a.mem_cap_gb is None:
        try:
            import psutil

            a.mem_cap_gb = 0.85 * psutil.virtual_memory().total / 1024**3
        except ImportError:
            a.mem_cap_gb = 1e9
    peers = [p for p in ("trl", "grpokit") if a.only in (None, p)]
    if "trl" in peers and not Path(a.trl_python).exists():
        sys.exit(
            f"TRL's interpreter {a.trl_python} is missing: run `make bench` (it creates .venv-bench), "
            "or pass --trl-python / --only grpokit"
        )
    python = {"grpokit": a.grpokit_python, "trl": a.trl_python}

    print(f"# grpokit vs TRL ({stamp}); load average {[round(x, 2) for x in os.getloadavg()]}", flush=True)
    peak = measure_peak(a.grpokit_python, env, results / f"{stamp}-peak-before.json")

    if a.quick:
        base = {"G": 4, "B": 2, "T": 16, "steps": 2, "mbs": 4}
    else:
        base = {"G": 8, "B": 4, "T": 64, "steps": a.steps, "mbs": 8}
    g_fast, g_extra = setting_args(a.grpokit_fast)
    t_fast, t_extra = setting_args(a.trl_fast)
    plan: list[tuple[str, str, dict]] = []  # (comparison, peer, cfg)
    if not a.scaling_only:
        for _ in range(a.repeats):
            for comp, settings in (
                ("a_same_precision", {"trl": ("fp32", []), "grpokit": ("fp32", [])}),
                ("b_fastest", {"trl": (t_fast, t_extra), "grpokit": (g_fast, g_extra + ["--parity"])}),
            ):
                for peer in peers:
                    prec, extra = settings[peer]
                    plan.append((comp, peer, dict(base, precision=prec, extra=extra)))
    if a.scaling or a.scaling_only:
        for G, T in (map(int, cell.split("x")) for cell in a.grid.split(",")):
            for peer in peers:
                plan.append(
                    (
                        f"scaling_G{G}_T{T}",
                        peer,
                        dict(base, G=G, T=T, steps=a.scaling_steps, precision="fp32", extra=[]),
                    )
                )

    runs = []
    for i, (comp, peer, cfg) in enumerate(plan):
        name = f"{stamp}-{i:02d}-{comp}-{peer}-{cfg['precision']}"
        out = results / f"{name}.json"
        cap = a.scaling_time_cap if comp.startswith("scaling") else a.time_cap
        print(
            f"\n## [{i + 1}/{len(plan)}] {comp}: {peer} {cfg['precision']} {' '.join(cfg['extra'])} "
            f"(G={cfg['G']}, B={cfg['B']}, T={cfg['T']}, steps={cfg['steps']})",
            flush=True,
        )
        load_before = round(os.getloadavg()[0], 2)
        info = run_child(
            child_cmd(peer, python[peer], out, cfg),
            env=env,
            time_cap=cap,
            mem_cap_gb=a.mem_cap_gb,
            log_path=results / f"{name}.log",
        )
        row = {
            "comparison": comp,
            "peer": peer,
            "setting": cfg["precision"] + "".join("+" + e.lstrip("-") for e in cfg["extra"] if e != "--parity"),
            "cfg": cfg,
            **info,
            "load_before": load_before,
            "load_after": round(os.getloadavg()[0], 2),
        }
        if info["status"] == "ok" and out.exists():
            res = json.loads(out.read_text())
            # the child's own ru_maxrss, taken before any parity check; polling may miss short peaks
            row.update(result=res, summary=summarize(res, peak), notes=res.get("notes", {}))
            row["setting"] = res["setting"]
        runs.append(row)
        print(
            f"   -> {row['status']}; {fmt(row.get('summary', {}).get('step_s'))} s/step, {info['wall_s']:.0f} s wall",
            flush=True,
        )

    after = measure_peak(a.grpokit_python, env, results / f"{stamp}-peak-after.json")
    peak = {
        "threads": peak["threads"],
        "before": peak,
        "after": after,
        **{k: {"peak_gflops": max(peak[k]["peak_gflops"], after[k]["peak_gflops"])} for k in ("fp32", "bf16")},
    }
    for row in runs:  # MFU against the higher of the two peaks
        if row.get("result"):
            row["summary"] = summarize(row["result"], peak)
    report = render(runs, peak)
    print("\n" + report)
    summary = {"stamp": stamp, "peak": peak, "runs": runs, "args": vars(a), "report_markdown": report}
    (results / f"{stamp}-summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"\nresults: {results}/{stamp}-*.json")


def measure_peak(python: str, env: dict, path: Path) -> dict:
    subprocess.run([python, str(HERE / "peak_flops.py"), "--out", str(path)], env=env, check=True, capture_output=True)
    peak = json.loads(path.read_text())
    print(
        f"matmul peak ({peak['threads']} threads): fp32 {peak['fp32']['peak_gflops']:.0f} GFLOP/s, "
        f"bf16 {peak['bf16']['peak_gflops']:.0f} GFLOP/s; load average {[round(x, 2) for x in os.getloadavg()]}",
        flush=True,
    )
    return peak


def rerender(summary_path: str, peak_json: str | None) -> None:
    """Print the report of a saved ``*-summary.json`` again (with today's formulas), optionally
    against another peak measurement (``peak_flops.py --out``)."""
    summary = json.loads(Path(summary_path).read_text())
    peak = summary["peak"]
    if peak_json:
        peak = json.loads(Path(peak_json).read_text())
    for row in summary["runs"]:
        if row.get("result"):
            row["summary"] = summarize(row["result"], peak)
    print(render(summary["runs"], peak))


def _median_by(runs, comp, peer):
    """The median of each summary field over repeated runs of ``comp``/``peer`` (None if none ran)."""
    ss = [r["summary"] for r in runs if r["comparison"] == comp and r["peer"] == peer and r.get("summary")]
    if not ss:
        return None
    return {k: statistics.median(s[k] for s in ss) for k in ss[0]}


def render(runs: list[dict], peak: dict) -> str:
    out = [
        f"matmul peak ({peak['threads']} torch threads): fp32 {peak['fp32']['peak_gflops']:.0f} GFLOP/s, "
        f"bf16 {peak['bf16']['peak_gflops']:.0f} GFLOP/s. MFU = (6 · N_body · D + 6 · V · d · C) / train_s / peak "
        "(N_body = parameters outside the tied embedding/LM head; D = non-padding tokens the training "
        "forward/backward ran; C = completion tokens, where the LM head runs; MFU_seq: D = Σ prompt+completion "
        "tokens per row, the unshared work)."
    ]
    main = [r for r in runs if not r["comparison"].startswith("scaling")]
    if main:
        out += [
            "",
            "### Runs",
            run_table(main),
            "",
            "### Ratios grpokit / TRL (lower is better)",
            "| comparison | s/step | target | gen s | logp+ref s | train s | peak RSS | target "
            "| grpokit MFU | target |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for comp, step_target in (
            ("a_same_precision", TARGETS["same_precision_step"]),
            ("b_fastest", TARGETS["fastest_step"]),
        ):
            g, t = _median_by(runs, comp, "grpokit"), _median_by(runs, comp, "trl")
            if not g:
                continue

            def r(k, g=g, t=t):
                return ratio(g.get(k), t.get(k)) if t else None

            out.append(
                f"| {comp} | {fmt(r('step_s'))} | ≤ {step_target} | {fmt(r('gen_s'))} | "
                f"{fmt(r('logp_ref_s'))} | {fmt(r('train_s'))} | {fmt(r('peak_rss_gb'))} | ≤ {TARGETS['memory']} | "
                f"{fmt(100 * g['mfu'], '.1f')}% | ≥ {100 * TARGETS['mfu']:.0f}% |"
            )
        for r_ in main:
            par = (r_.get("notes") or {}).get("parity")
            if par:
                out.append(
                    f"\nparity of grpokit {r_['setting']} vs its plain fp32 path (same weights, same batch): "
                    + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in par.items())
                )
    grid = [r for r in runs if r["comparison"].startswith("scaling")]
    if grid:
        out += [
            "",
            "### Scaling (fp32 both; s/step median of measured steps, peak RSS GB)",
            "| G | max new tokens | grpokit s/step | TRL s/step | ratio | grpokit GB | TRL GB | ratio "
            "| mean len g / t |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        keys = sorted({r["comparison"] for r in grid}, key=lambda c: tuple(int(x[1:]) for x in c.split("_")[1:]))
        for comp in keys:
            G, T = (int(x[1:]) for x in comp.split("_")[1:])
            cell = {}
            for peer in ("grpokit", "trl"):
                rr = [r for r in grid if r["comparison"] == comp and r["peer"] == peer]
                cell[peer] = rr[0] if rr else None

            def val(peer, k, cell=cell):
                r = cell[peer]
                if r is None:
                    return None, "not run"
                if r["status"] != "ok":
                    return None, r["status"]
                return r["summary"].get(k), None

            def show(peer, k, spec=".1f"):
                v, why = val(peer, k)
                return why if why else fmt(v, spec)

            rs = ratio(val("grpokit", "step_s")[0], val("trl", "step_s")[0])
            rm = ratio(val("grpokit", "peak_rss_gb")[0], val("trl", "peak_rss_gb")[0])
            out.append(
                f"| {G} | {T} | {show('grpokit', 'step_s')} | {show('trl', 'step_s')} | {fmt(rs)} | "
                f"{show('grpokit', 'peak_rss_gb')} | {show('trl', 'peak_rss_gb')} | {fmt(rm)} | "
                f"{show('grpokit', 'completion_len')} / {show('trl', 'completion_len')} |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    main()
