"""The report of a run: accuracy with Wilson 95% intervals, tokens, estimated cost, latency p50/p95,
cache hit rate per strategy and config (seeds pooled, and per seed), paired comparisons between them
(exact McNemar, paired bootstrap: evals/compare.py) and the cost-accuracy Pareto front, as Markdown,
JSON and PNG plots."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from reasonray.evals.compare import clustered_interval, compare, group_by, holm, non_inferiority, pareto_front, rounded
from reasonray.evals.datasets import Example
from reasonray.evals.grid import Cell
from reasonray.evals.runner import Record
from reasonray.evals.scoring import extract_number, same_number
from reasonray.evals.studies import k_curves, learning_curves, repeat

NON_INFERIORITY_MARGIN = 0.10  # bounded context against chain of thought at the same config and budget
COMPARED = ("a", "b", "paired", "both", "only_a", "only_b")  # a comparison's names and counts, as its table shows them


@dataclass(frozen=True)
class Prices:
    """USD per million tokens, for the cost estimate (the report states them)."""

    input_per_m: float = 0.15
    output_per_m: float = 0.60

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_m + completion_tokens * self.output_per_m) / 1_000_000


def wilson(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion (sound at 0 and at n, unlike the normal approximation)."""
    if n == 0:
        return 0.0, 0.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def summarise(group: str, strategy: str, config_name: str, records: list[Record], prices: Prices) -> dict[str, Any]:
    """A row of the report (`latencies_ms`, every latency, is for the plots only)."""
    n = len(records)
    correct = sum(r.correct for r in records)
    repeated = len({r.example_id for r in records}) < n  # seeds or stream orders: records cluster by example
    low, high = clustered_interval({(r.example_id, i): r.correct for i, r in enumerate(records)}) if repeated else wilson(correct, n)
    lenient = sum(r.correct_lenient or r.correct for r in records)
    prompt = sum(r.prompt_tokens for r in records)
    completion = sum(r.completion_tokens for r in records)
    calls = sum(r.llm_calls for r in records)
    latencies = sorted(r.latency_ms for r in records if r.status == "ok")
    return {
        "group": group,  # strategy/config (seeds pooled) or strategy/config/seed=N
        "strategy": strategy,
        "config_name": config_name,
        "examples": n,
        "correct": correct,
        "errors": sum(r.status == "error" for r in records),
        "accuracy": correct / n if n else 0.0,
        "ci_low": low,
        "ci_high": high,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens_per_example": (prompt + completion) / n if n else 0.0,
        "cost_usd": prices.cost(prompt, completion),
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p95_ms": percentile(latencies, 95),
        "llm_calls_per_example": calls / n if n else 0.0,
        "cache_hit_rate": sum(r.cache_hits for r in records) / calls if calls else 0.0,
        "latencies_ms": latencies,
        "correct_lenient": lenient,  # any number in the answer or its reasoning equals the reference
        "accuracy_lenient": lenient / n if n else 0.0,
        "ci_method": "clustered bootstrap" if repeated else "wilson",  # wilson: one record per example
        "budget": records[0].budget if records else None,
        "found_by": dict(Counter(r.found_by or "unknown" for r in records if r.status == "ok")) or None,  # answers per reading
    }


def baselines(examples: list[Example]) -> list[dict[str, Any]]:
    """Trivial answers scored like any row: `constant` (the most frequent reference answer: chosen knowing the
    references, so an optimistic baseline) and `echo` (the question's last number)."""
    numeric = [e for e in examples if e.kind == "gsm8k"]
    if not numeric:
        return []
    constant = Counter(e.reference for e in numeric).most_common(1)[0][0]
    n, rows = len(numeric), []
    for name, answer, answer_of in (
        ("constant", constant, lambda e: constant),
        ("echo", "the question's last number", lambda e: extract_number(e.query) or ""),
    ):
        correct = sum(same_number(answer_of(e), e.reference) for e in numeric)
        low, high = wilson(correct, n)
        row = {"name": name, "answer": answer, "examples": n, "correct": correct, "accuracy": correct / n, "ci_low": low, "ci_high": high}
        rows.append(rounded(row))
    return rows


def build_report(
    records: list[Record], cells: list[Cell], meta: dict[str, Any], prices: Prices, examples: list[Example] | None = None
) -> dict[str, Any]:
    by_cell = group_by(records, lambda r: r.cell)
    groups = group_by(cells, lambda c: c.group)
    pooled = {group: [r for c in members for r in by_cell.get(c.key, [])] for group, members in groups.items()}
    rows = [summarise(group, members[0].strategy, members[0].config_name, pooled[group], prices) for group, members in groups.items()]
    per_seed = [summarise(c.key, c.strategy, c.config_name, by_cell.get(c.key, []), prices) for c in cells]
    outcomes = {group: {(r.example_id, repeat(r)): r.correct for r in members} for group, members in pooled.items()}
    names = [g for g in groups if outcomes[g]]
    comparisons = [asdict(compare(a, outcomes[a], b, outcomes[b])) for i, a in enumerate(names) for b in names[i + 1 :]]
    for comparison, adjusted in zip(comparisons, holm([c["mcnemar_p"] for c in comparisons]), strict=True):
        comparison["p_holm"] = adjusted
    front = pareto_front([(r["tokens_per_example"], r["accuracy"]) for r in rows])
    inferiority = [
        asdict(non_inferiority(a, outcomes[a], b, outcomes[b], margin=NON_INFERIORITY_MARGIN))
        for a in names
        for b in names
        if a.startswith("bounded_context/") and b.startswith("chain_of_thought/") and _base(a) == _base(b)
    ]
    return {
        **meta,
        "simulated": any(r.simulated for r in records),
        "prices_usd_per_million_tokens": asdict(prices),
        "records": len(records),
        "rows": [_public(r) for r in rows],
        "per_seed": [_public(r) for r in per_seed],
        "comparisons": [rounded(c) for c in comparisons],
        "pareto_front": [rows[i]["group"] for i in front],
        "baselines": baselines(examples or []),
        "non_inferiority": [rounded(c) for c in inferiority],
        "learning_curves": learning_curves(records),
        "k_curves": k_curves(records),
        "_rows": rows,
    }


def _base(group: str) -> str:
    """A row's config name without its per-call cap (`cap256@64` -> `cap256`), memory arm kept."""
    _, _, rest = group.partition("/")
    config, _, arm = rest.partition("/")
    return "/".join(p for p in (config.split("@")[0], arm) if p)


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rounded(row).items() if k != "latencies_ms"}


SIMULATED_NOTE = (
    "**Simulated model.** These answers come from ReasonRay's simulated model (docs/simulator.md), "
    "which answers dataset questions from an answer key with a set skill. The accuracy figures exercise "
    "the strategies and the pipeline; they say nothing about any real model."
)


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Evaluation: {report['dataset']['name']} ({report['dataset']['examples']} examples)", ""]
    if report["simulated"]:
        lines += [f"> {SIMULATED_NOTE} Skill: {report.get('simulator_skill')}.", ""]
    lines += [
        f"- model: `{report['model']}`{' (SIMULATED)' if report['simulated'] else ''}",
        f"- dataset: `{report['dataset']['path']}` ({report['dataset']['kind']}, selection {report['dataset']['digest']})",
        f"- seeds: {', '.join(map(str, report['seeds']))}; memory-aware: {'yes' if report['memory'] else 'no'}",
        *_provenance_lines(report),
        f"- cost at ${report['prices_usd_per_million_tokens']['input_per_m']}/M input and "
        f"${report['prices_usd_per_million_tokens']['output_per_m']}/M output tokens (an estimate)",
        "",
        f"| strategy / config | n | strict accuracy{' (SIMULATED)' if report['simulated'] else ''} (95% CI) | lenient | errors | tokens/example | cost (USD) | latency p50 / p95 (ms) | LLM calls/example | cache hit rate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['group']} | {row['examples']} | {row['accuracy']:.1%} ({row['ci_low']:.1%}-{row['ci_high']:.1%}) | {row['accuracy_lenient']:.1%} | "
            f"{row['errors']} | {row['tokens_per_example']:.0f} | {row['cost_usd']:.4f} | "
            f"{row['latency_p50_ms']:.0f} / {row['latency_p95_ms']:.0f} | {row['llm_calls_per_example']:.2f} | {row['cache_hit_rate']:.1%} |"
        )
    lines += [
        "",
        "Strict: the answer the strategy found (its last number). Lenient: any number in the answer or its reasoning "
        "equals the reference (an upper bound for answer reading, never the headline). Intervals: Wilson with one "
        "record per example; a bootstrap resampling examples when seeds or stream orders repeat them.",
    ]
    if report.get("baselines"):
        rows = [[b["name"], b["answer"], str(b["examples"]), _ci(b, ".1%")] for b in report["baselines"]]
        lines += _table("Baselines", ["baseline", "answer", "n", "accuracy (95% CI)"], rows)
    if len(report["seeds"]) > 1:
        rows = [[r["group"], str(r["examples"]), _ci(r, ".1%"), f"{r['tokens_per_example']:.0f}"] for r in report["per_seed"]]
        lines += _table("Per seed", ["cell", "n", "accuracy (95% CI)", "tokens/example"], rows)
    if report.get("comparisons"):
        lines += _table(
            "Paired comparisons",
            ["A", "B", "paired examples", "both right", "A better", "B better", "exact p", "Holm p", "A - B (95% CI)", "bootstrap p"],
            [
                [*(str(c[k]) for k in COMPARED), _p(c["mcnemar_p"]), _p(c["p_holm"]), _difference(c, ""), _p(c["bootstrap_p"])]
                for c in report["comparisons"]
            ],
            intro="Same examples, strategy A against strategy B, counted by example (seeds of one example are one example: its "
            "outcome is its mean over seeds): examples where each did better, the exact sign test on them (McNemar's with "
            "one seed) with its Holm-adjusted p over every comparison of this report, and the accuracy difference A - B "
            "with its 95% interval and p from a bootstrap that resamples examples. A failed example counts as wrong.",
        )
    if report.get("pareto_front"):
        lines += ["", f"Cost-accuracy Pareto front (tokens per example against accuracy): {', '.join(report['pareto_front'])}."]
    lines += _studies_markdown(report)
    plots = ["accuracy_vs_tokens.png", "pareto.png", "latency.png"]
    plots += ["learning_curve.png"] * bool(report.get("learning_curves")) + ["k_curve.png"] * bool(report.get("k_curves"))
    lines += ["", f"Plots: {', '.join(f'`{p}`' for p in plots)}. Every example: `results.jsonl`; what ran: `run.json`.", ""]
    return "\n".join(lines)


def _provenance_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    if sha := report["dataset"].get("sha256"):
        lines.append(f"- dataset sha256: `{sha}`")
    if budgets := report.get("budgets"):
        lines.append(f"- per-call budgets: {', '.join(map(str, budgets))} tokens")
    if study := report.get("memory_study"):
        lines.append(f"- memory study: arms {', '.join(study['arms'])} on {study['orders']} stream order(s)")
    if (prov := report.get("provenance") or {}).get("git_commit"):
        lines.append(f"- code: `{prov['git_commit'][:12]}`{' with uncommitted changes' if prov.get('git_dirty') else ''}")
    return lines


def _studies_markdown(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for n in report.get("non_inferiority") or []:
        verdict = "non-inferior" if n["non_inferior"] else "non-inferiority not shown"
        lines += [
            "",
            f"Non-inferiority, {n['a']} against {n['b']} (margin {n['margin']:.0%}, {n['paired']} examples): difference "
            f"{n['difference']:+.1%}, one-sided 95% lower bound {n['lower_bound']:+.1%}: {verdict}.",
        ]
    for curve in report.get("learning_curves") or []:
        blocks = next(iter(curve["arms"].values()))
        head = ["arm", *(f"block {b['block']} ({b['positions'][0]}-{b['positions'][1]})" for b in blocks)]
        rows = [[f"memory {arm}", *map(_ci, blocks)] for arm, blocks in curve["arms"].items()]
        lines += _table(f"Learning curve: {curve['group']}", head, rows)
        if checks := curve.get("memory"):
            stored = "; ".join(f"{arm} {c['stored']} stored, retrieved in {c['retrieved_share']:.0%} of runs" for arm, c in checks.items())
            lines += ["", f"Memory items by arm: {stored}."]
            if checks.get("on", {}).get("stored") == 0:
                lines[-1] += " **Memory on stored no item over its streams: this run does not test learning.**"
        for field, other in (("later", "off"), ("later_vs_placebo", "placebo")):
            if later := curve.get(field):
                lines += [
                    "",
                    f"Later part of the stream (positions {later['from_position']} on, {later['paired']} examples): on - {other} "
                    f"{_difference(later)}, exact p {_p(later['mcnemar_p'])}.",
                ]
    for curve in report.get("k_curves") or []:
        rules = ("majority", "judge", "oracle")
        rows = [[str(point["k"]), *(_ci(point[r]) for r in rules)] for point in curve["points"]]
        lines += _table(f"Scaling with k: {curve['group']}", ["k", "majority@k", "judge-selected@k", "oracle pass@k"], rows)
        for c in curve.get("comparisons") or []:
            lines.append(
                f"\n{c['a']} - {c['b']}: {_difference(c)}, {c['only_a']} examples better, {c['only_b']} worse, exact p {_p(c['mcnemar_p'])}."
            )
    return lines


def plots(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """accuracy_vs_tokens.png (with the 95% intervals), latency.png (distributions per row), pareto.png (the
    cost-accuracy front) and, when the run holds those studies, learning_curve.png (each memory arm's accuracy by
    block of the stream) and k_curve.png (majority@k, judge-selected@k and oracle pass@k)."""
    rows: list[dict[str, Any]] = report["_rows"]
    tag = " (SIMULATED model)" if report["simulated"] else ""
    paths: dict[str, Path] = {}

    ax = _axes()
    for label, members in _curves(rows).items():  # a strategy's budgets joined into its curve
        ax.errorbar(*_xy(members), yerr=_error_bars(members), fmt="o-" if len(members) > 1 else "o", capsize=4, label=label)
    title = f"Accuracy against tokens{tag}"
    paths["accuracy_plot"] = _save(ax, out / "accuracy_vs_tokens.png", "tokens per example", "accuracy (%), 95% CI", title, legend=8)

    ax = _axes()
    ax.boxplot([row["latencies_ms"] or [0.0] for row in rows], showfliers=True)
    ax.set_xticks(range(1, len(rows) + 1), [row["group"] for row in rows], rotation=20, ha="right", fontsize=8)
    ax.set(ylabel="latency per example (ms)", title=f"Latency distributions{tag}")
    ax.grid(alpha=0.3, axis="y")
    ax.figure.tight_layout()
    ax.figure.savefig(out / "latency.png", dpi=110)
    paths["latency_plot"] = out / "latency.png"
    paths["pareto_plot"] = _pareto_plot(rows, out / "pareto.png", tag)

    if report.get("learning_curves"):
        ax = _axes()
        for curve in report["learning_curves"]:
            for arm, blocks in curve["arms"].items():  # each block at its centre
                centres, accuracies = [sum(b["positions"]) / 2 for b in blocks], [b["accuracy"] * 100 for b in blocks]
                ax.errorbar(centres, accuracies, yerr=_error_bars(blocks), fmt="o-", capsize=3, label=f"{curve['group']} memory {arm}")
        title = f"Learning curve: memory on and off on the same streams{tag}"
        paths["learning_plot"] = _save(
            ax, out / "learning_curve.png", "position in the stream (block centre)", "accuracy (%), 95% CI (examples resampled)", title
        )
    if report.get("k_curves"):
        ax = _axes()
        for curve in report["k_curves"]:
            ks = [p["k"] for p in curve["points"]]
            for rule, name in (("majority", "majority@k"), ("judge", "judge-selected@k"), ("oracle", "oracle pass@k")):
                ax.plot(ks, [p[rule]["accuracy"] * 100 for p in curve["points"]], "o-", label=f"{curve['group']} {name}")
        paths["k_plot"] = _save(ax, out / "k_curve.png", "k (attempts)", "accuracy (%)", f"Test-time scaling from one run at k = K{tag}")
    return paths


def _pareto_plot(rows: list[dict[str, Any]], path: Path, tag: str) -> Path:
    """Accuracy (95% Wilson interval) against tokens per example, the non-dominated rows joined by the
    front's staircase: a row off the front is beaten by one that costs no more and is no less accurate."""
    points = [(row["tokens_per_example"], row["accuracy"]) for row in rows]
    front = pareto_front(points)
    ax = _axes((7.5, 4.8))
    for label, members in _curves(rows).items():
        if len(members) > 1:  # the budget axis: each strategy's accuracy against its cost, as a curve
            ax.plot(*_xy(members), "-", alpha=0.6, label=f"{label} (budgets)")
    for i, row in enumerate(rows):
        on_front = i in front
        style = {"fmt": "o", "markersize": 8, "alpha": 1.0} if on_front else {"fmt": "s", "markersize": 6, "alpha": 0.55}
        ax.errorbar(*_xy([row]), yerr=_error_bars([row]), capsize=4, label=f"{row['group']}{' (front)' if on_front else ''}", **style)
    if front:
        ax.step(*_xy([rows[i] for i in front]), where="post", color="black", linewidth=1, linestyle="--", label="Pareto front")
    logarithmic = all(x > 0 for x, _ in points)  # costs spread over orders of magnitude (1 call to dozens)
    if logarithmic:
        ax.set_xscale("log")
    xlabel = f"tokens per example{' (log scale)' if logarithmic else ''}: the cost"
    return _save(ax, path, xlabel, "accuracy (%), 95% Wilson CI", f"Cost against accuracy{tag}")


def _curves(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows of one strategy and config at several budgets (`NAME@B`) as one curve, by increasing tokens."""
    curves: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        base = row["config_name"].rsplit("@", 1)[0] if row["budget"] is not None else row["config_name"]
        suffix = row["group"].removeprefix(f"{row['strategy']}/{row['config_name']}")  # a memory arm, if any
        curves.setdefault(f"{row['strategy']}/{base}{suffix}", []).append(row)
    return {label: sorted(members, key=lambda r: r["tokens_per_example"]) for label, members in curves.items()}


def _xy(rows: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """The rows' tokens per example and accuracies (%): the points of a curve."""
    return [row["tokens_per_example"] for row in rows], [row["accuracy"] * 100 for row in rows]


def _axes(size: tuple[float, float] = (7, 4.5)) -> Any:
    from matplotlib.figure import Figure  # no pyplot: the caller's backend (a notebook's) stays as it is

    return Figure(figsize=size).subplots()


def _save(ax: Any, path: Path, xlabel: str, ylabel: str, title: str, legend: int = 7) -> Path:
    """The frame every accuracy plot shares (0-100% with a margin, a light grid, a legend), saved at 110 dpi."""
    ax.set(xlabel=xlabel, ylabel=ylabel, ylim=(-5, 105), title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=legend)
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=110)
    return path


def _error_bars(points: list[dict[str, Any]]) -> list[list[float]]:
    """The intervals around the accuracies, in points; clipped at 0 where rounding puts a bound a hair past it."""
    return [[max(0.0, p["accuracy"] - p["ci_low"]) * 100 for p in points], [max(0.0, p["ci_high"] - p["accuracy"]) * 100 for p in points]]


def write_report(report: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "report.md", "json": out / "report.json"}
    paths["markdown"].write_text(markdown(report), encoding="utf-8")
    public = {k: v for k, v in report.items() if not k.startswith("_")}
    paths["json"].write_text(json.dumps(public, indent=2), encoding="utf-8")
    return paths | plots(report, out)


def _table(title: str, head: list[str], rows: list[list[str]], intro: str = "") -> list[str]:
    """A titled Markdown table, with a paragraph before it when there is one."""
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]
    return ["", f"## {title}", "", *([intro, ""] if intro else []), *table]


def _ci(point: dict[str, Any], bounds: str = ".0%") -> str:
    """An accuracy with its 95% interval."""
    return f"{point['accuracy']:.1%} ({point['ci_low']:{bounds}}-{point['ci_high']:{bounds}})"


def _difference(c: dict[str, Any], label: str = "95% CI ") -> str:
    """A comparison's difference with its interval."""
    return f"{c['difference']:+.1%} ({label}{c['ci_low']:+.1%} to {c['ci_high']:+.1%})"


def _p(value: float | str) -> str:
    """A p-value as the report rounds it (6 decimals): below that it is shown as a bound, not as 0; a bound the
    bootstrap gave ("< 0.0002") as it is."""
    if isinstance(value, str):
        return value
    return "<1e-6" if value < 1e-6 else f"{value:.3g}"
