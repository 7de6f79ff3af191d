"""bench/latency.py in a tiny form: every level's streams end, with their first chunks and no failure, and
the farm's and the web's first chunks are split at the hops the jobs' results time."""

from tests.support import markdown_table, run_bench


def test_every_level_streams_every_job_and_reports_its_first_chunk(tiny_assets, data_dir, tmp_path):
    finished = run_bench(
        "latency",
        *("--model", "synthetic-tiny", "--cpu", "1", "--clients", "1,3", "--seconds", "1", "--workdir", str(tmp_path)),
        "--engine",
        "--web",
        "--plain-first",
        *("--py-spy", str(tmp_path / "py-spy")),
        data_dir=data_dir,
    )
    rows = markdown_table(finished.stdout.splitlines(), "| path |")
    paths = [(row["path"], row["clients"]) for row in rows]
    levels = [("engine", "1"), ("engine", "3"), ("farm", "1"), ("farm", "3"), ("web", "1"), ("web", "3")]
    assert paths == [*levels, ("farm, not streamed, first", "3"), ("farm, not streamed", "3")]
    for row in rows[: len(levels)]:
        assert row["failed"] == "0"
        assert float(row["chunks a stream"]) >= 1
        assert 0 < float(row["first chunk p50 ms"]) <= float(row["p95 ms"]) <= float(row["p99 ms"])
    assert all(float(row["audio-s/s"]) > 0 for row in rows)
    # Each streamed level's throughput (and the unstreamed level run first) is also given as a share of
    # the farm's, not streamed, run last.
    plain = float(rows[-1]["audio-s/s"])
    for row in rows[: len(levels) + 1]:
        share, streamed = float(row["of the farm not streamed"].rstrip("%")), float(row["audio-s/s"])
        # Both throughputs are printed to a tenth, the share to a whole percent.
        assert 100 * (streamed - 0.05) / (plain + 0.05) - 0.5 <= share <= 100 * (streamed + 0.05) / (plain - 0.05) + 0.5
    assert rows[-1]["of the farm not streamed"] == ""
    p50s = {(row["path"], row["clients"]): float(row["first chunk p50 ms"]) for row in rows[: len(levels)]}
    hops = markdown_table(finished.stdout.splitlines(), "| path | clients | submit")
    assert [(row["path"], row["clients"]) for row in hops] == [("farm", "1"), ("farm", "3"), ("web", "1"), ("web", "3")]
    for row in hops:
        to_engine, sent_by_engine, to_worker, to_redis, to_client = (
            None if cell == "-" else [float(figure) for figure in cell.split(" / ")] for cell in list(row.values())[2:]
        )
        assert 0 < to_engine[0] <= to_engine[1]
        assert to_client[0] <= to_client[1]
        assert 0 < sent_by_engine[0] <= sent_by_engine[1] and 0 <= to_worker[0] <= to_worker[1]
        # The farm's clients read the stream's entries, whose ids say when Redis appended them; the web's do not.
        assert (to_redis is None) == (row["path"] == "web")
        # The hops of a job add up to its first chunk; one client's p50s are that job's own. Each hop (five at
        # most) and the first chunk are printed to a whole ms: they agree within half a ms each.
        if row["clients"] == "1":
            printed = [hop[0] for hop in (to_engine, sent_by_engine, to_worker, to_redis, to_client) if hop]
            assert abs(sum(printed) - p50s[row["path"], "1"]) <= 0.5 * (len(printed) + 1)
        # The clocks (the client's, the engine's, Redis's) are one host's; Redis's counts whole milliseconds.
        assert to_client[0] > -5 and (to_redis is None or to_redis[0] > -5)
    # Level by level, the engine's thread: in steps, of which waiting for the device (none on a CPU).
    threads = markdown_table(finished.stdout.splitlines(), "| path | clients | level wall s")
    assert [(row["path"], row["clients"]) for row in threads] == [
        ("farm, not streamed, first", "3"),
        *levels[2:],
        ("farm, not streamed", "3"),
    ]
    for row in threads:
        in_steps, waiting, own = (
            float(row[name]) for name in ("in steps s", "waiting for the device s", "host's own work s")
        )
        assert 0 < in_steps < float(row["level wall s"]) + 1.0  # the engine reports twice a second
        assert waiting == 0 and own == in_steps
        # A CPU worker pins no host memory and has no CUDA allocator.
        assert row["pinned blocks made"] == "0" and row["making them s"] == "0.00"
        assert row["device blocks made"] == "0" and row["allocator retries"] == "0"
    # And the workers' processes and Redis, level by level: the workers were busy (Redis may have used less than
    # /proc's 10 ms tick), and page faults are counts.
    processes = markdown_table(finished.stdout.splitlines(), "| path | clients | Celery CPU s")
    assert [(row["path"], row["clients"]) for row in processes] == [(row["path"], row["clients"]) for row in threads]
    for row in processes:
        assert float(row["Celery CPU s"]) > 0 and float(row["engine CPU s"]) > 0 and float(row["Redis CPU s"]) >= 0
        assert all(row[f"{kind} page faults"].isdigit() for kind in ("Celery", "engine", "Redis")), row
    # With --py-spy, where the engine process's threads were over each level the workers ran: its engine's
    # thread (the batcher's) sampled busy in every one.
    lines = finished.stdout.splitlines()
    titles = [line for line in lines if line.startswith("where an engine process's threads were")]
    assert titles == [
        f"where an engine process's threads were, {row['path']}, {row['clients']} clients (py-spy):" for row in threads
    ]
    for title in titles:
        rows = {row["thread"]: row for row in markdown_table(lines[lines.index(title) :], "| thread |")}
        assert int(rows["batcher"]["samples"]) > 0 and rows["batcher"]["running Python"].endswith("%"), rows


def test_in_turn_each_streamed_level_is_set_against_the_unstreamed_levels_on_either_side(
    tiny_assets, data_dir, tmp_path
):
    finished = run_bench(
        "latency",
        *("--model", "synthetic-tiny", "--cpu", "1", "--clients", "2", "--seconds", "1", "--workdir", str(tmp_path)),
        *("--in-turn", "2"),
        data_dir=data_dir,
    )
    lines = finished.stdout.splitlines()
    # The levels ran in turn after the streamed one, the closing unstreamed level last.
    threads = markdown_table(lines, "| path | clients | level wall s")
    assert [row["path"] for row in threads] == [
        "farm",
        *["farm, not streamed, in turn", "farm, in turn"] * 2,
        "farm, not streamed",
    ]
    closing = float(markdown_table(lines, "| path |")[-1]["audio-s/s"])
    rounds = markdown_table(lines, "| round |")
    assert [row["round"] for row in rounds] == ["1", "2"]
    afters = [float(rounds[1]["not streamed audio-s/s"]), closing]
    shares = []
    for row, after in zip(rounds, afters, strict=True):
        assert row["failed"] == "0" and float(row["first chunk p95 ms"]) > 0
        before, streamed = float(row["not streamed audio-s/s"]), float(row["streamed audio-s/s"])
        share = float(row["streamed / unstreamed beside it"].rstrip("%"))
        # Throughputs printed to a tenth, shares to a tenth of a percent.
        expected = 100 * streamed / ((before + after) / 2)
        assert abs(share - expected) <= 0.05 + expected * 0.1 / min(before, after, streamed)
        shares.append(share)
    summary = next(line for line in lines if line.startswith("streamed / unstreamed over 2 rounds"))
    median, least, most = (float(part.split()[-1].rstrip("%")) for part in summary.split(": ")[1].split(", "))
    assert (least, most) == (min(shares), max(shares))
    # The median of two is their mean: the printed median and each printed share are rounded to a tenth of a
    # percent, so the median and the mean of the printed shares differ by at most two such roundings.
    assert abs(median - sum(shares) / 2) <= 0.1 + 1e-9
