"""`prepare`'s summary as the few lines the command prints (`format_summary`)."""

from __future__ import annotations

import os

from maxtext_netdata.data.prepare import local_runner


def format_summary(summary: dict) -> str:
  """The summary as a few readable lines."""
  splits = summary["splits"]
  lines = [
    f"store     {summary['path']}{'  (cached)' if summary.get('cached') else ''}"
    + (f"  (copied from {summary['copied_from']})" if summary.get("copied_from") else ""),
    f"rows      {summary['rows']:,} of {summary['rows_read']:,} read, "
    f"{summary['probes']:,} probes, {summary['failed_share']:.1%} failed",
  ]
  for name in ("train", "test", "eval"):
    if name in splits:
      split = splits[name]
      span = split.get("span")  # absent from summaries written before stores kept it
      times = f", {local_runner.utc(span[0])} to {local_runner.utc(span[1])} UTC" if span else ""
      lines.append(f"{name:<9} {split['rows']:,} rows, {split['probes']:,} probes{times}")
  since, until = summary.get("time_bounds") or (None, None)
  if since is not None or until is not None:
    outside = (
      summary["rows_read"] - summary["skipped_rows"] - sum(s["rows"] for s in splits.values())
    )
    span = local_runner.span_text((since, until))
    lines.append(f"window    {span}: {outside:,} valid rows outside it")
  converted = summary.get("converted_from")
  if converted:
    lines.append(
      f"converted from {converted['path']} (store format {converted['format_version']}) in"
      f" {converted['seconds']:.2f} s: its seconds as uint32, its other files linked"
    )
  appended = summary.get("appended")
  if appended:
    lines.append(
      f"appended  {appended['new_files']:,} new file(s), {appended['new_rows_read']:,} rows read,"
      f" to {appended['base']} ({appended['base_rows']:,} rows); merged in"
      f" {appended['merge_seconds']:.2f} s"
    )
  removed = summary.get("removed")
  if removed:
    why = [f"{removed['files']:,} file(s) no longer listed"] if removed["files"] else []
    why += ["the rows outside the new time bounds"] if removed.get("rebound") else []
    lines.append(
      f"removed   {removed['rows']:,} rows of {removed['base']} ({removed['base_rows']:,} rows):"
      f" {', '.join(why)}" + ("" if appended else f"; copied in {removed['merge_seconds']:.2f} s")
    )
  recut = summary.get("recut")
  if recut:
    lines.append(
      f"recut     the time split of {recut['base']} ({recut['base_rows']:,} rows), test fraction"
      f" {recut['test_fraction']:g} -> {summary['network_test_fraction']:g}"
      + ("" if appended or removed else f"; copied in {recut['merge_seconds']:.2f} s")
    )
  pruned = summary.get("pruned")
  if pruned is not None:
    names = ", ".join(os.path.basename(root) for root in pruned["stores"]) or "none"
    lines.append(
      f"pruned    {len(pruned['stores'])} superseded store(s) ({names}),"
      f" {pruned['bytes'] / 1e6:,.1f} MB freed"
    )
  if summary["skipped"]:
    reasons = ", ".join(f"{reason}: {n:,}" for reason, n in sorted(summary["skipped"].items()))
    lines.append(f"skipped   {summary['skipped_rows']:,} rows ({reasons})")
  if (removed or recut) and not appended:
    lines.append(f"speed     {summary['seconds']:.2f} s, no file read")
  else:
    lines.append(
      f"speed     {summary['seconds']:.2f} s, {summary['rows_per_s']:,} rows/s, "
      f"{summary['rows_per_cpu_s']:,} rows per CPU-second" + (" (rows read)" if appended else "")
    )
  per_row = summary.get("peak_bytes_per_row")
  lines.append(
    f"memory    peak RSS {summary['peak_rss_bytes'] / 2**20:,.0f} MiB"
    + (f", {per_row} bytes per raw row above the start" if per_row is not None else "")
  )
  return "\n".join(lines)
