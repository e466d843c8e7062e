#!/usr/bin/env python3
"""Plot contended hand-off latency per backend as an SVG bar chart.

Reads the JSON lines written by `distlock bench --json` (one per backend,
in the order given) and writes a grouped bar chart of p50 / p99 / max
hand-off latency on a log scale. Standard library only.

Usage: scripts/plot-handoff.py OUT.svg RESULT.json [RESULT.json ...]
"""
import json
import math
import sys


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 64
    out, paths = sys.argv[1], sys.argv[2:]
    rows = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            d = json.loads(f.read().strip().splitlines()[-1])
        label = d.get("label") or d["backend"]
        lat = d["handoff_latency_ms"]
        rows.append((label, lat["p50"], lat["p99"], lat["max"]))

    series = [("p50", "#4477aa"), ("p99", "#ee6677"), ("max", "#ccbb44")]
    width, height, left, bottom, top = 760, 420, 70, 70, 40
    plot_w, plot_h = width - left - 20, height - top - bottom
    values = [v for r in rows for v in r[1:] if v > 0]
    lo = 10 ** math.floor(math.log10(min(values))) if values else 0.01
    hi = 10 ** math.ceil(math.log10(max(values))) if values else 10
    span = math.log10(hi) - math.log10(lo) or 1

    def y(v: float) -> float:
        v = max(v, lo)
        return top + plot_h - (math.log10(v) - math.log10(lo)) / span * plot_h

    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">Contended hand-off latency (release → next holder), ms, log scale</text>',
    ]
    decade = lo
    while decade <= hi * 1.0001:
        yy = y(decade)
        svg.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{width - 20}" y2="{yy:.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{decade:g}</text>')
        decade *= 10
    group_w = plot_w / max(len(rows), 1)
    bar_w = group_w / (len(series) + 1)
    for i, (label, *vals) in enumerate(rows):
        gx = left + i * group_w + bar_w / 2
        for j, ((name, color), v) in enumerate(zip(series, vals)):
            x = gx + j * bar_w
            yy = y(v)
            svg.append(f'<rect x="{x:.1f}" y="{yy:.1f}" width="{bar_w * 0.9:.1f}" height="{top + plot_h - yy:.1f}" fill="{color}"><title>{label} {name}: {v:.3f} ms</title></rect>')
            svg.append(f'<text x="{x + bar_w * 0.45:.1f}" y="{yy - 3:.1f}" text-anchor="middle" font-size="9">{v:.2g}</text>')
        svg.append(f'<text x="{gx + bar_w * 1.5:.1f}" y="{top + plot_h + 18}" text-anchor="middle">{label}</text>')
    for j, (name, color) in enumerate(series):
        lx = left + j * 80
        svg.append(f'<rect x="{lx}" y="{height - 22}" width="12" height="12" fill="{color}"/>')
        svg.append(f'<text x="{lx + 16}" y="{height - 12}">{name}</text>')
    svg.append("</svg>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(svg) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
