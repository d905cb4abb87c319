#!/usr/bin/env python3
"""Paper-style figures from the benchmarks' JSON results.

Reads every ``*.json`` under ``--results`` (bench/results, written by
``_harness.json_line``) and draws into ``--out`` (bench/figures).  Which
figure shows what, from which keys and which file: bench/figures/README.md.
Nothing is drawn that is not in a file.
"""
import argparse
import glob
import json
import math
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field, replace

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = ("sparse_lr", "geo", "streaming", "kmeans", "dask_globals")  # the order of the panels
TITLES = {"sparse_lr": "sparse logistic regression", "geo": "geo k-NN queries", "streaming": "streaming updates",
          "kmeans": "k-means", "dask_globals": "Dask globals: grid k-NN",
          "dask_globals/kdtree": "Dask globals: KDTree k-NN", "recovery": "k-means, a worker killed",
          "sparse_lr/one host": "sparse logistic regression, one host"}
# drawn from their hosts run and, in a panel beside it, from their newest one-host run
ONE_HOST_TOO = ("sparse_lr",)
NAMES = {"clamor": "clamor", "spark": "Spark", "dask": "Dask", "ray": "Ray", "redis": "Redis",
         "scatter": "Dask scatter", "mpi": "MPI", "broadcast_zero_copy": "broadcast zero-copy"}
BENCH_NAMES = {"kmeans": {"baseline": "mp + numpy"}}   # kmeans.py's baseline: a multiprocessing fork Pool
PEER_ORDER = ("clamor", "spark", "dask", "scatter", "ray")
NOT_SYSTEMS = {"single", "serial", "reference"}  # one-process reference runs, not systems under test
CLAMOR = "#c8102e"
COLOURS = {"spark": "#5b84b1", "dask": "#6aa56a", "scatter": "#6aa56a", "ray": "#9b82c0", "redis": "#b08d62",
           "broadcast": "#a3a3a3", "baseline": "#4f4f4f"}
OTHER_COLOURS = ("#7fb3c8", "#c89b7f", "#b5b55f", "#c07fa6", "#a0a0a0")
WIDTH_IN, DPI = 8.0, 100  # 800 px: README width
KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


# ---- reading ---------------------------------------------------------------------------

@dataclass
class Record:
    """One results file."""
    path: str
    bench: str          # the script: "sparse_lr", "geo", ...
    quick: bool
    hosts: object       # int or None (not recorded)
    date: str           # as json_line writes it: 2026-11-27T07:37:34+0000
    commit: str
    machine: dict
    figures: dict

    @property
    def file(self):
        return os.path.basename(self.path)

    @property
    def plain(self):    # <bench>.json or <bench>-quick.json, not a -hosts<N> variant
        return re.fullmatch(rf"{re.escape(self.bench)}(-quick)?\.json", self.file) is not None


def load(results):
    """Every readable results file under ``results``, with a message for each
    one that is not."""
    out = []
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        try:
            with open(path) as f:
                rec = json.load(f)
            figs = rec["figures"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"figures: {os.path.basename(path)}: not a results file ({err})")
            continue
        name = os.path.splitext(os.path.basename(path))[0]
        bench = figs.get("bench") or re.sub(r"(-quick|-hosts\d+)+$", "", rec.get("bench") or name)
        quick = bool(figs.get("quick")) or "-quick" in name or "--quick" in (rec.get("argv") or [])
        hosts = figs.get("hosts")
        m = re.search(r"-hosts(\d+)", name)
        if hosts is None and m:
            hosts = int(m.group(1))
        out.append(Record(path, bench, quick, hosts, str(rec.get("date") or "undated"),
                          rec.get("commit") or "unknown commit", rec.get("machine") or {}, figs))
    return out


def pick(records, bench):
    """The file to draw ``bench`` from: full before quick, <bench>.json before
    -hosts<N> variants, newest first; None when there is none."""
    cands = [r for r in records if r.bench == bench]
    if not cands:
        return None
    return sorted(cands, key=lambda r: (not r.quick, r.plain, r.date, r.file))[-1]


# ---- what a file says -------------------------------------------------------------------

def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


@dataclass
class System:
    name: str
    time: object = None         # seconds per unit, or None
    bytes: object = None        # bytes moved, or None (unknown)
    times: list = None          # per-iteration seconds
    missing: str = None         # why it did not run
    mapped: object = None       # bytes mapped rather than copied (clamor on one host)


@dataclass
class Panel:
    """One workload of one file: what every figure needs of it."""
    key: str                    # "sparse_lr", "dask_globals/kdtree", ...
    rec: Record
    unit: str
    systems: list
    speedups: dict = field(default_factory=dict)    # peer -> clamor's speedup over it
    inverted: list = field(default_factory=list)    # peers whose speedup is 1 / ratio_vs_<peer>
    disagree: list = field(default_factory=list)    # peers whose file speedup differs from the bars' ratio

    def system(self, name):
        return next((s for s in self.systems if s.name == name), None)


def _order(names):
    return sorted(names, key=lambda n: (PEER_ORDER.index(n) if n in PEER_ORDER else len(PEER_ORDER), n))


def generic_panel(rec):
    """The workload of a file written with ``<s>_iter_s`` keys, or None."""
    f = rec.figures
    names = set()
    for k, v in f.items():
        m = re.fullmatch(r"([a-z0-9_]+?)_(iter_s|missing)", k)
        if not m or m.group(1) in NOT_SYSTEMS:
            continue
        s = m.group(1)
        known = s in NAMES or f"{s}_times_s" in f or f"{s}_bytes" in f
        if known and (num(v) is not None or (m.group(2) == "missing" and v)):
            names.add(s)
    if not names:
        return None
    systems = []
    for s in _order(names):
        times = f.get(f"{s}_times_s")
        systems.append(System(s, num(f.get(f"{s}_iter_s")), num(f.get(f"{s}_bytes")),
                              [t for t in times if num(t) is not None] if isinstance(times, list) else None,
                              f.get(f"{s}_missing") or None,
                              num(f.get(f"{s}_bytes_mapped", f.get(f"{s}_mapped_bytes_total")))))
    p = Panel(rec.bench, rec, f.get("time_unit") or _unit(f, systems), systems)
    _speedups(p, "")
    return p


def _unit(f, systems):
    """A file without ``time_unit``: "s per iteration" when every system's
    list holds ``iters`` times, else plain seconds."""
    n = num(f.get("iters"))
    lists = [s.times for s in systems if s.time is not None]
    return "s per iteration" if n and lists and all(t and len(t) == n for t in lists) else "s"


def _speedups(p, prefix):
    """clamor's speedup over each peer: the file's own figure when it has one."""
    f, cl = p.rec.figures, p.system("clamor")
    for s in p.systems:
        if s.name == "clamor":
            continue
        sp, ratio = num(f.get(f"{prefix}speedup_vs_{s.name}")), num(f.get(f"{prefix}ratio_vs_{s.name}"))
        inverted = sp is None and bool(ratio)
        if inverted:
            sp = 1.0 / ratio
        bars = s.time / cl.time if cl and cl.time and s.time is not None else None
        if sp is not None and bars is not None and abs(sp - bars) > 0.05 * bars:
            print(f"figures: {p.rec.file}: {p.key}: clamor's speedup over {s.name} is {sp:.3g} in the file "
                  f"but {bars:.3g} from the two times drawn; the figure writes {bars:.3g}")
            p.disagree.append(s.name)
            sp = None
        if sp is None:
            sp = bars
        if sp is not None and s.time is not None:
            p.speedups[s.name] = sp
            if inverted and s.name not in p.disagree:
                p.inverted.append(s.name)


def dask_globals_panels(rec):
    """dask_globals.py's rounds: clamor's references against Dask's scatter,
    the grid index and (when it ran) the KDTree."""
    f, out = rec.figures, []
    for prefix, key in (("", "dask_globals"), ("kdtree_", "dask_globals/kdtree")):
        if num(f.get(f"{prefix}clamor_s")) is None:
            continue
        q = num(f.get("queries"))
        unit = f"s per round of {q:,} queries" if q else "s per round"
        systems = [System(s, num(f.get(f"{prefix}{s}_s")), num(f.get(f"{prefix}{s}_bytes")))
                   for s in ("clamor", "scatter")]
        p = Panel(key, rec, unit, systems)
        _speedups(p, prefix)
        out.append(p)
    return out


def panels_of(rec, _seen={}):
    """Every workload panel a file gives ([] when it has none)."""
    if rec.path not in _seen:
        p = generic_panel(rec)
        _seen[rec.path] = [p] if p else dask_globals_panels(rec) if rec.bench == "dask_globals" else []
    return _seen[rec.path]


# ---- words -------------------------------------------------------------------------------

def link(f):
    hosts = f.get("hosts")
    if hosts is None:
        return "hosts not recorded"
    if hosts == 1:
        return "one host, loopback"
    return f"{hosts} hosts, {f['rate']} links" if f.get("rate") else f"{hosts} hosts, link rate not recorded"


def where(rec):
    w = rec.figures.get("workers")
    return link(rec.figures) + (f", {w} workers" if w else "")


def machine(recs, override=None):
    """The machine the runs were on, from their files ("2-core, 24 GiB")."""
    if override:
        return override
    seen = []
    for r in recs:
        m = r.machine
        cpus = m.get("cpus")
        mem = m.get("mem_bytes") or m.get("memory_bytes") or (m.get("mem_gib") or 0) * GIB
        d = ", ".join(([f"{cpus}-core"] if cpus else []) + ([f"{mem / GIB:.0f} GiB"] if mem else []))
        d = d or "machine not recorded"
        if d not in seen:
            seen.append(d)
    # a file that recorded less of the same machine ("2-core" beside "2-core, 24 GiB") adds nothing
    seen = [d for d in seen if not any(o != d and o.startswith(d + ",") for o in seen)]
    return "; ".join(seen) if seen else "machine not recorded"


def title(p):
    return TITLES.get(p.key, p.key.replace("_", " ")) + (" (quick run)" if p.rec.quick else "")


def sources(recs):
    out, seen = [], set()
    for r in recs:
        if r.path not in seen:
            seen.add(r.path)
            out.append(f"{r.file} ({r.date[:10]}, {r.commit}{', quick run' if r.quick else ''})")
    return "Data: " + "; ".join(out) + "."


def name(s, bench=None):
    return BENCH_NAMES.get(bench, {}).get(s) or NAMES.get(s, s.replace("_", " "))


def legend_name(s, bench=None):
    """A legend entry per colour: Dask's scatter is the Dask peer."""
    return "Dask" if s == "scatter" else name(s, bench)


def colour(s, _others={}):
    if s == "clamor":
        return CLAMOR
    if s in COLOURS:
        return COLOURS[s]
    return _others.setdefault(s, OTHER_COLOURS[len(_others) % len(OTHER_COLOURS)])


def fmt_x(v):
    return f"{v:.0f}x" if v >= 10 else f"{v:.1f}x" if v >= 1 else f"{v:.2f}x"


def fmt_bytes(n):
    for unit, m in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= m:
            v = n / m
            return f"{v:.0f} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


# ---- drawing -------------------------------------------------------------------------------

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "xtick.labelsize": 9,
                         "ytick.labelsize": 9, "legend.fontsize": 9, "figure.titlesize": 11,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _grid(plt, n, row_in=2.9, extra_in=1.5, max_cols=3, span_last=False):
    """n panels in rows of 2 or 3; with ``span_last``, a last panel alone in
    its row of 2 takes the whole row."""
    cols = 1 if n == 1 else 2 if n in (2, 4) or max_cols == 2 else 3
    rows = math.ceil(n / cols)
    fig = plt.figure(figsize=(WIDTH_IN, row_in * rows + extra_in))
    gs = fig.add_gridspec(rows, cols)
    axes = []
    for i in range(n):
        r, c = divmod(i, cols)
        alone = span_last and cols == 2 and i == n - 1 and c == 0
        axes.append(fig.add_subplot(gs[r, :] if alone else gs[r, c]))
    return fig, axes


def _finish(fig, plt, path, heading, footer, legend=None):
    """Heading, an optional legend under it, the footer (machine, link, data),
    laid out in inches so that they keep their size whatever the rows."""
    h = fig.get_size_inches()[1]
    fig.suptitle(heading, fontweight="bold", y=1 - 0.06 / h, va="top")
    top = 0.28
    if legend:
        handles, labels = legend
        ncol = len(labels) if len(labels) <= 7 else math.ceil(len(labels) / 2)
        rows = math.ceil(len(labels) / ncol)   # matplotlib fills a legend column by column: read it by rows
        order = [r * ncol + c for c in range(ncol) for r in range(rows) if r * ncol + c < len(labels)]
        handles, labels = [handles[k] for k in order], [labels[k] for k in order]
        fig.legend(handles, labels, loc="upper center", ncol=ncol, frameon=False,
                   bbox_to_anchor=(0.5, 1 - 0.3 / h), handlelength=1.6, columnspacing=1.4)
        top = 0.62
    text = "\n".join(textwrap.fill(t, 118) for t in footer)
    lines = text.count("\n") + 1
    fig.text(0.01, 0.06 / h, text, fontsize=9, va="bottom", ha="left", color="#333333")
    fig.tight_layout(rect=(0, (0.155 * lines + 0.2) / h, 1, 1 - top / h), pad=0.3, h_pad=1.2, w_pad=1.0)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    print(f"figures: wrote {path}")


def draw_time_per_system(panels, out, mach):
    plt = _plt()
    fig, axes = _grid(plt, len(panels), row_in=2.6, max_cols=2)
    inverted, disagree = [], []
    for ax, p in zip(axes, panels):
        xs = range(len(p.systems))
        hs = [s.time or 0 for s in p.systems]
        ax.bar(xs, hs, color=[colour(s.name) for s in p.systems], width=0.7)
        top = max(hs) or 1
        ax.set_ylim(0, top * 1.18)
        for x, s in zip(xs, p.systems):
            if s.time is None:
                lab = "n/a"
            elif s.name == "clamor":
                lab = f"{s.time:.3g} s"
            else:
                lab = fmt_x(p.speedups[s.name]) if s.name in p.speedups else ""
            ax.text(x, (s.time or 0) + top * 0.02, lab, ha="center", va="bottom", fontsize=9,
                    fontweight="bold" if s.name != "clamor" and s.time else "normal")
        labels = [textwrap.fill(name(s.name, p.rec.bench), 10) for s in p.systems]
        spec = ax.get_subplotspec()
        slot_pt = 0.82 * WIDTH_IN * 72 * len(spec.colspan) / spec.get_gridspec().ncols / len(labels)
        tilt = max(len(w) for lab in labels for w in lab.split("\n")) * 5.0 > 0.9 * slot_pt  # 9 pt: ~5 pt a character
        ax.set_xticks(list(xs), labels, rotation=30 if tilt else 0, ha="right" if tilt else "center",
                      rotation_mode="anchor" if tilt else "default")
        ax.set_ylabel(p.unit)
        ax.set_title(f"{title(p)}\n{where(p.rec)}")
        inverted += [f"{p.key} vs {name(s, p.rec.bench)}" for s in p.inverted]
        disagree += [f"{p.key} vs {name(s, p.rec.bench)}" for s in p.disagree]
    foot = [f"Machine: {mach}. On a peer's bar: clamor's speedup over it (peer time / clamor time; below 1x the "
            "peer is faster); on clamor's bar its time. n/a: the system did not run."]
    if inverted:
        foot.append("Speedup = 1 / the file's ratio_vs_<peer> (clamor time / peer time) for: "
                    + ", ".join(inverted) + ".")
    if disagree:
        foot.append("The file's own speedup differs from the ratio of the times drawn (more than 5%; the ratio is "
                    "written) for: " + ", ".join(disagree) + ".")
    foot.append(sources([p.rec for p in panels]))
    _finish(fig, plt, os.path.join(out, "time_per_system.png"), "Time per system", foot)


def _byte_ticks(lo, hi):
    """Powers of two from lo to hi, evenly spaced on the log axis, at most 7."""
    exps = range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1)
    for step in (1, 2, 4, 10, 20):
        ticks = [2 ** e for e in exps if e % step == 0]
        if len(ticks) <= 7:
            return ticks
    return ticks


def draw_bytes(panels, out, mach):
    plt = _plt()
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(WIDTH_IN, 5.0))
    vals = [s.bytes for p in panels for s in p.systems if s.bytes]
    lo = 2 ** math.floor(math.log2(min(vals)) - 1.5)
    hi = 2 ** math.ceil(math.log2(max(vals)) + 0.5)
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    width = 0.8 / max(len(p.systems) for p in panels)
    legend = {}
    for i, p in enumerate(panels):
        for j, s in enumerate(p.systems):
            x = i + (j - (len(p.systems) - 1) / 2) * width
            legend.setdefault(legend_name(s.name, p.rec.bench), (s.name, Patch(color=colour(s.name))))
            if s.bytes:
                ax.bar(x, s.bytes - lo, bottom=lo, width=width * 0.9, color=colour(s.name))
            else:   # nothing to draw on a log axis: say why at its foot
                lab = "n/a" if s.bytes is None else "0 B, mapped" if s.mapped else "0 B"
                ax.text(x, lo * 1.12, lab, ha="center", va="bottom", fontsize=9, color=colour(s.name),
                        fontweight="bold", rotation=90)
    ticks = _byte_ticks(lo, hi)
    ax.set_yticks(ticks, [fmt_bytes(t) for t in ticks])
    ax.minorticks_off()
    ax.set_ylabel("bytes moved (log scale)")
    wrap = max(12, int(0.82 * WIDTH_IN * 72 / len(panels) / 5.2))   # characters a group's label has room for

    def label(p):
        f = p.rec.figures
        h, w = f.get("hosts"), f.get("workers")
        lines = textwrap.wrap(TITLES.get(p.key, p.key), wrap) + (["(quick run)"] if p.rec.quick else [])
        lines.append(link(f) if h is None or h == 1 and len(panels) <= 4 else
                     "1 host" if h == 1 else f"{h} hosts, {f.get('rate') or 'rate?'}")
        return "\n".join(lines + ([f"{w} workers"] if w else []))

    ax.set_xticks(range(len(panels)), [label(p) for p in panels])
    ax.set_xlim(-0.55, len(panels) - 0.45)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    order = sorted(legend, key=lambda k: _order([v[0] for v in legend.values()]).index(legend[k][0]))
    foot = [f"Machine: {mach}. Bytes moved over the timed part, as each benchmark counts them (its <system>_bytes); "
            "1 host: loopback. "
            "n/a: not measured; 0 B, mapped: same-host workers mapped the driver's pages, none were copied.",
            sources([p.rec for p in panels])]
    _finish(fig, plt, os.path.join(out, "bytes_moved.png"), "Bytes moved per system", foot,
            legend=([legend[k][1] for k in order], order))


def hosts_series(records):
    """{(bench, quick): {hosts: record}} for benches with two host counts or
    more (a full and a quick run are never mixed: their sizes differ)."""
    groups = {}
    for r in records:
        if isinstance(r.hosts, int) and panels_of(r):
            g = groups.setdefault((r.bench, r.quick), {})
            if r.hosts not in g or (r.date, r.file) > (g[r.hosts].date, g[r.hosts].file):
                g[r.hosts] = r
    out = {}
    for (bench, quick), g in sorted(groups.items()):
        if len(g) >= 2 and not (quick and (bench, False) in out):
            out[(bench, quick)] = dict(sorted(g.items()))
    return out


def draw_time_vs_hosts(series, out, mach):
    plt = _plt()
    lines = []   # one panel per workload part: (key, quick, {hosts: Panel})
    for (bench, quick), g in series.items():
        for k in sorted({p.key for r in g.values() for p in panels_of(r)}):
            lines.append((bench, k, quick, {h: next(p for p in panels_of(r) if p.key == k)
                                            for h, r in g.items() if any(p.key == k for p in panels_of(r))}))
    fig, axes = _grid(plt, len(lines), max_cols=2, span_last=True)
    seen = {}
    for ax, (bench, k, quick, by) in zip(axes, lines):
        hs = sorted(by)
        for n in _order({s.name for p in by.values() for s in p.systems}):
            pts = [(h, by[h].system(n).time) for h in hs if by[h].system(n) and by[h].system(n).time is not None]
            if pts:
                ln, = ax.plot(*zip(*pts), marker="o", color=colour(n), lw=2.2 if n == "clamor" else 1.5)
                seen.setdefault(legend_name(n, bench), ln)
        ax.set_xticks(hs, [f"{h}\n{link(by[h].rec.figures).split(', ', 1)[-1]}" for h in hs])
        ax.set_xlabel("hosts")
        ax.set_ylabel(next(iter(by.values())).unit)
        ax.set_ylim(bottom=0)
        ws = {p.rec.figures.get("workers") for p in by.values()}
        ax.set_title(TITLES.get(k, k) + (" (quick runs)" if quick else "")
                     + (f", {ws.pop()} workers" if len(ws) == 1 and None not in ws else ""))
        ax.margins(x=0.08)
    recs = [p.rec for *_, by in lines for p in by.values()]
    foot = [f"Machine: {mach}. Under each host count: the link between hosts.", sources(recs)]
    _finish(fig, plt, os.path.join(out, "time_vs_hosts.png"), "Time against the number of hosts", foot,
            legend=(list(seen.values()), list(seen)))


def recovery_ok(rec):
    f = rec.figures
    return isinstance(f.get("iter_s"), list) and len(f["iter_s"]) > 1 and num(f.get("fail_at")) is not None


def draw_iterations(panels, recovery, out, mach):
    plt = _plt()
    n = len(panels) + (1 if recovery else 0)
    fig, axes = _grid(plt, n, max_cols=2, span_last=True)   # lines need the width
    seen = {}
    for ax, p in zip(axes, panels):
        all_t = []
        for s in p.systems:
            if s.times:
                ln, = ax.plot(range(1, len(s.times) + 1), s.times, marker="o", ms=3.5, color=colour(s.name),
                              lw=2.2 if s.name == "clamor" else 1.4)
                seen.setdefault(legend_name(s.name, p.rec.bench), ln)
                all_t += s.times
        _time_axis(ax, all_t)
        word = "round" if "round" in p.unit else "iteration"
        ax.set_xlabel(word)
        ax.set_ylabel(f"s per {word}" + (" (log)" if ax.get_yscale() == "log" else ""))
        ax.set_title(f"{title(p)}\n{where(p.rec)}")
    if recovery:
        ax, f = axes[-1], recovery.figures
        t, k = f["iter_s"], int(f["fail_at"])
        ln, = ax.plot(range(1, len(t) + 1), t, marker="o", ms=3.5, color=CLAMOR, lw=2.2, label="clamor")
        seen.setdefault("clamor", ln)
        marks = [ax.axvspan(k - 0.5, k + 0.5, color="#f2c4c4", zorder=0, label="worker killed")]
        if num(f.get("normal_iter_s")):
            marks.append(ax.axhline(f["normal_iter_s"], color="#555555", ls="--", lw=1,
                                    label="median before"))
        ax.legend(handles=marks, loc="upper right", frameon=False, handlelength=1.4)
        ax.set_ylim(0, max(t) * 1.45)
        ax.set_xticks(range(1, len(t) + 1, 1 if len(t) <= 10 else 2))
        ax.set_xlabel("iteration")
        ax.set_ylabel("s per iteration")
        w = f.get("workers")
        ax.set_title(f"{TITLES['recovery']}{' (quick run)' if recovery.quick else ''}\n"
                     f"{link(f)}{f', {w} workers' if w else ''}")
    recs = [p.rec for p in panels] + ([recovery] if recovery else [])
    words = [f"Machine: {mach}."]
    if any(p.key == "streaming" for p in panels):
        words.append("Every round of streaming updates follows one update of the table by the driver.")
    if recovery and num(recovery.figures.get("normal_iter_s")):
        k = int(recovery.figures["fail_at"])
        words.append(f"Worker killed: the dashed line is the median of iterations 2-{k - 1} "
                     "(the first faults the points in).")
    foot = [" ".join(words), sources(recs)]
    _finish(fig, plt, os.path.join(out, "iterations.png"), "Time per iteration, across updates and a failure", foot,
            legend=(list(seen.values()), list(seen)))


def _time_axis(ax, values):
    """Log y when the values span more than 20x (plain numbers on the ticks)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    pos = [v for v in values if v > 0]
    if pos and max(pos) / min(pos) > 20:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(0, max(pos or [1]) * 1.1)


# ---- planning ------------------------------------------------------------------------------

def plan(records):
    """What can be drawn from which file: {figure: (panels or data, [messages])}."""
    msgs, panels = [], []
    benches = list(WORKLOADS) + sorted({r.bench for r in records} - set(WORKLOADS) - {"recovery"})
    for b in benches:
        rec = pick(records, b)
        if rec is None:
            if b in WORKLOADS:
                msgs.append(f"{b}: no {b}.json or {b}-quick.json; skipped")
            continue
        ps = panels_of(rec)
        if b in ONE_HOST_TOO and rec.hosts != 1:
            one = pick([r for r in records if r.bench == b and r.hosts == 1], b)
            ps = ps + ([replace(p, key=f"{b}/one host") for p in panels_of(one)] if one else [])
            if one is None:
                msgs.append(f"{b}/one host: no one-host run of {b}; only its hosts run drawn")
        if not ps and b in WORKLOADS:
            msgs.append(f"{b}: {rec.file} has no per-system times (<system>_iter_s); skipped")
        for p in ps:
            for s in p.systems:
                if s.time is None:
                    msgs.append(f"{p.key}: {s.name} has no time in {rec.file}: {s.missing or 'no reason given'}")
            if all(s.time is None for s in p.systems):
                msgs.append(f"{p.key}: no system has a time in {rec.file}; skipped")
        panels += ps
    timed = [p for p in panels if any(s.time is not None for s in p.systems)]
    moved = [p for p in panels if any(s.bytes is not None for s in p.systems)]
    iters = [p for p in panels if any(s.times for s in p.systems)]
    rec = pick([r for r in records if recovery_ok(r)], "recovery")
    if rec is None:
        msgs.append("recovery: no recovery.json or recovery-quick.json with iter_s and fail_at "
                    "(python bench/recovery.py --quick writes one)")
    series = hosts_series(records)
    counts = {}
    for r in records:
        if isinstance(r.hosts, int) and panels_of(r):
            counts.setdefault((r.bench, r.quick), set()).add(r.hosts)
    for (b, q), hs in sorted(counts.items()):
        if len(hs) < 2:
            msgs.append(f"time_vs_hosts: {b}{' (quick)' if q else ''} has results at one host count only "
                        f"({next(iter(hs))}); no line drawn")
    return {"time_per_system.png": timed, "bytes_moved.png": moved, "time_vs_hosts.png": series,
            "iterations.png": (iters, rec)}, msgs


def check(pl):
    def files(ps):
        return ", ".join(f"{p.key} <- {p.rec.file}" for p in ps) or "nothing"

    print(f"time_per_system.png: {files(pl['time_per_system.png'])}")
    print(f"bytes_moved.png:     {files(pl['bytes_moved.png'])}")
    s = pl["time_vs_hosts.png"]
    print("time_vs_hosts.png:   " + ("; ".join(f"{b}{' (quick)' if q else ''} at hosts "
                                              + ", ".join(f"{h} <- {r.file}" for h, r in g.items())
                                              for (b, q), g in s.items()) or "nothing (no bench at two host counts)"))
    iters, rec = pl["iterations.png"]
    print(f"iterations.png:      {files(iters)}" + (f", recovery <- {rec.file}" if rec else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=os.path.join(HERE, "results"), help="the JSON files (bench/results)")
    ap.add_argument("--out", default=os.path.join(HERE, "figures"), help="where the PNGs go (bench/figures)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="only list which figures can be drawn from which files")
    mode.add_argument("--smoke", action="store_true", help="--check, then draw every figure into a temporary "
                      "directory (removed) when matplotlib is installed; a JSON line last (the tests run it)")
    ap.add_argument("--machine", help='the machine, for the captions (default: from the files, e.g. "2-core")')
    args = ap.parse_args(argv)

    records = load(args.results)
    if not records:
        print(f"figures: no results files in {args.results}")
        return 1
    pl, msgs = plan(records)
    for m in msgs:
        print(f"figures: {m}")
    if args.check:
        check(pl)
        return 0
    if args.smoke:
        return smoke(pl, records, args)
    draw_all(pl, args.out, args)
    return 0


def smoke(pl, records, args):
    """--check, then every figure drawn into a temporary directory: the
    drawing code runs on the results there are, and nothing is kept."""
    import tempfile

    sys.path.insert(0, HERE)
    from _harness import json_line

    check(pl)
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError as err:
        drawn, why = None, f"matplotlib is not installed ({err}): figures planned, not drawn"
        print(f"figures: smoke: {why}", flush=True)
    else:
        why = None
        with tempfile.TemporaryDirectory(prefix="clamor-figures-") as tmp:
            draw_all(pl, tmp, args)
            drawn = {f: os.path.getsize(os.path.join(tmp, f)) for f in sorted(os.listdir(tmp)) if f.endswith(".png")}
        print(f"figures: smoke: drew {', '.join(drawn) or 'nothing'} into a temporary directory (removed)", flush=True)
    iters, rec = pl["iterations.png"]
    json_line({"bench": "figures", "smoke": True, "records": len(records),
               "planned": {"time_per_system.png": len(pl["time_per_system.png"]),
                           "bytes_moved.png": len(pl["bytes_moved.png"]),
                           "time_vs_hosts.png": len(pl["time_vs_hosts.png"]),
                           "iterations.png": len(iters) + (1 if rec else 0)},
               "drawn_bytes": drawn, "not_drawn": why})
    return 0


def draw_all(pl, out, args):
    """Every figure the plan ``pl`` allows, into ``out``; a PNG the plan no
    longer allows is removed from there."""
    os.makedirs(out, exist_ok=True)

    def skip(png, why):   # a PNG left from older results would say what the files no longer do
        print(f"figures: {png}: {why}; not drawn")
        old = os.path.join(out, png)
        if os.path.exists(old):
            os.remove(old)
            print(f"figures: removed the stale {old}")

    timed, moved, series = pl["time_per_system.png"], pl["bytes_moved.png"], pl["time_vs_hosts.png"]
    iters, rec = pl["iterations.png"]
    # (figure, whether it can be drawn, how, from which files, why not)
    for png, ok, draw, recs, why in (
            ("time_per_system.png", timed, lambda m: draw_time_per_system(timed, out, m), [p.rec for p in timed],
             "no workload with per-system times"),
            ("bytes_moved.png", any(s.bytes for p in moved for s in p.systems), lambda m: draw_bytes(moved, out, m),
             [p.rec for p in moved], "no workload with bytes moved"),
            ("time_vs_hosts.png", series, lambda m: draw_time_vs_hosts(series, out, m),
             [r for g in series.values() for r in g.values()], "no bench has results at two host counts or more"),
            ("iterations.png", iters or rec, lambda m: draw_iterations(iters, rec, out, m),
             [p.rec for p in iters] + ([rec] if rec else []), "no per-iteration times")):
        if ok:
            draw(machine(recs, args.machine))
        else:
            skip(png, why)

if __name__ == "__main__":
    sys.exit(main())
