"""Finished replay reports on disk, as the commands that read them (the
ablation chain, the verdict) find and load them, and their plain-text
tables."""

from __future__ import annotations

from pathlib import Path

from tiertp.json_file import read_json_object


def load_report(path: Path) -> dict:
    """report.json, given the file or the folder holding it; an error
    naming the file when it is missing or is not a replay report."""
    report, file = read_json_object(Path(path), "report.json", "a replay report",
                                    f"no replay report; run `tiertp replay ... --out {path}` first")
    if not isinstance(report.get("loads"), list):
        raise ValueError(f"{file}: not a replay report (no 'loads' list)")
    return report


def find_reports(paths: list[Path]) -> list[Path]:
    """The report.json files `paths` name: each a report.json, or a folder
    searched for them at any depth (sorted)."""
    found = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(path.rglob("report.json")))
        else:
            raise FileNotFoundError(f"{path}: no such report or folder")
    if not found:
        raise FileNotFoundError(f"no report.json under {', '.join(map(str, paths))} (run tiertp replay first)")
    return found


def text_table(rows: list[list[str]] | list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
