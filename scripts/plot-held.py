#!/usr/bin/env python3
"""Plot the cost of a held lease against the number held, as an SVG.

Reads the JSON lines written by `distlock bench --held-only --json` (one
run per line; runs with the same label form one line of the plot) and
draws two panels, both against leases held on a log scale: CPU per lease
(microseconds of CPU a second, renewals included; log scale, since a
backend's fixed cost dominates at few leases) and resident memory per
lease (KiB). Standard library only.

Usage: scripts/plot-held.py OUT.svg RESULTS.jsonl
"""
import json
import math
import sys

COLORS = ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377"]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 64
    out, path = sys.argv[1], sys.argv[2]
    series = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            d = json.loads(line)
            h = d["held"]
            n = h["leases"]
            if not n:
                continue
            cpu_us = h["cpu_percent"] / 100 / n * 1e6
            kib = h["rss_added_kib"] / n
            series.setdefault(d["label"], []).append((n, cpu_us, kib, h["all_held"]))
    for pts in series.values():
        pts.sort()
    if not series:
        print(f"{path}: no runs with leases held", file=sys.stderr)
        return 65

    panel_w, height, left, top, bottom, gap = 380, 400, 60, 50, 80, 70
    width = left + 2 * panel_w + gap + 20
    plot_h = height - top - bottom
    counts = sorted({p[0] for pts in series.values() for p in pts})
    lo_n, hi_n = math.log10(min(counts)), math.log10(max(counts))
    span_n = (hi_n - lo_n) or 1

    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15">Cost of one held lease (ttl 3 s, renewed every second) against leases held</text>',
    ]
    panels = [
        (1, "CPU per lease, µs of CPU per second (log scale)", True),
        (2, "resident memory per lease, KiB", False),
    ]
    for k, (field, title, log) in enumerate(panels):
        x0 = left + k * (panel_w + gap)
        values = [p[field] for pts in series.values() for p in pts if p[field] > 0]
        if log:
            lo = 10 ** math.floor(math.log10(min(values))) if values else 0.1
            hi = 10 ** math.ceil(math.log10(max(values))) if values else 10
            ticks = [lo * 10**i for i in range(round(math.log10(hi / lo)) + 1)]
        else:
            lo, hi = 0.0, (max(values) * 1.15 if values else 1.0)
            step = 10 ** math.floor(math.log10(hi / 4))
            for mult in (1, 2, 5):
                if hi / (step * mult) <= 6:
                    step *= mult
                    break
            ticks = [i * step for i in range(int(hi / step) + 1)]

        def x(n: float) -> float:
            return x0 + (math.log10(n) - lo_n) / span_n * panel_w

        def y(v: float, log=log, lo=lo, hi=hi) -> float:
            if log:
                v = max(v, lo)
                return top + plot_h - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * plot_h
            return top + plot_h - v / hi * plot_h

        svg.append(f'<text x="{x0 + panel_w / 2}" y="{top - 10}" text-anchor="middle">{title}</text>')
        for v in ticks:
            svg.append(f'<line x1="{x0}" y1="{y(v):.1f}" x2="{x0 + panel_w}" y2="{y(v):.1f}" stroke="#ddd"/>')
            svg.append(f'<text x="{x0 - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        for n in counts:
            svg.append(f'<text x="{x(n):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{n:,}</text>')
        svg.append(f'<text x="{x0 + panel_w / 2}" y="{top + plot_h + 34}" text-anchor="middle">leases held (log scale)</text>')
        for i, (label, pts) in enumerate(series.items()):
            color = COLORS[i % len(COLORS)]
            path = " ".join(f"{x(p[0]):.1f},{y(p[field]):.1f}" for p in pts)
            svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
            for p in pts:
                fill = color if p[3] else "white"
                svg.append(f'<circle cx="{x(p[0]):.1f}" cy="{y(p[field]):.1f}" r="4" fill="{fill}" stroke="{color}"><title>{label}, {p[0]:,} held: {p[field]:.2f}</title></circle>')
    for i, label in enumerate(series):
        lx = left + i * 120
        color = COLORS[i % len(COLORS)]
        svg.append(f'<rect x="{lx}" y="{height - 22}" width="12" height="12" fill="{color}"/>')
        svg.append(f'<text x="{lx + 16}" y="{height - 12}">{label}</text>')
    svg.append("</svg>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(svg) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
