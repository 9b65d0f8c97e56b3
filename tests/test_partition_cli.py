"""The partition tool as users run it: --help, bad input (one line naming the file, no
traceback, nothing half-written), --force, and verify catching damaged directories."""
from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import BUNDLED_CORA, REPO, run_cli

from rudder.data.partition_store import METADATA_FILE, sha256_file

SBM = "synthetic:sbm:nodes=600,blocks=3,avg_degree=6,feat_dim=4,seed=1"


def assert_one_line_error(proc, *needles):
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("python -m partitioning: error: ")
    for needle in needles:
        assert str(needle) in lines[0], lines[0]


def no_leftovers(parent):
    return [name for name in os.listdir(parent) if ".tmp-" in name or ".old-" in name]


def test_help_lists_specs_and_verify():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for word in ("planetoid:DIR:NAME", "musae:", "ogb:", "npz:FILE", "edgelist:", "dgl:FILE", "synthetic:rmat",
                 "synthetic:sbm", "--num-parts", "--method", "verify DIR"):
        assert word in proc.stdout
    assert run_cli("verify", "--help").returncode == 0


def test_partition_then_verify(tmp_path):
    out = tmp_path / "parts"
    proc = run_cli("--input", f"planetoid:{BUNDLED_CORA}:cora", "--num-parts", 2, "--out", out, "--method", "random")
    assert proc.returncode == 0, proc.stderr
    assert "2708 nodes, 10556 directed edges" in proc.stdout and f"wrote {out}" in proc.stdout
    assert sorted(os.listdir(out)) == [METADATA_FILE, "part-00000.h5", "part-00001.h5"]
    check = run_cli("verify", out)
    assert check.returncode == 0 and check.stdout.startswith("OK "), check.stderr


def test_missing_file(cora_copy, tmp_path):
    os.remove(cora_copy / "ind.cora.tx")
    out = tmp_path / "out"
    proc = run_cli("--input", f"planetoid:{cora_copy}:cora", "--num-parts", 2, "--out", out)
    assert_one_line_error(proc, "ind.cora.tx", "file not found")
    assert not out.exists() and not no_leftovers(tmp_path)


def test_missing_directory(tmp_path):
    proc = run_cli("--input", f"musae:{tmp_path / 'nope'}:facebook", "--num-parts", 2, "--out", tmp_path / "o")
    assert_one_line_error(proc, "nope", "directory not found")


def test_unknown_spec(tmp_path):
    assert_one_line_error(run_cli("--input", "parquet:x.pq", "--num-parts", 2, "--out", tmp_path / "o"),
                          "--input", "unknown spec 'parquet:x.pq'", "planetoid:...")
    assert_one_line_error(run_cli("--input", "synthetic:grid:n=3", "--num-parts", 2, "--out", tmp_path / "o"),
                          "unknown generator 'grid'")
    assert_one_line_error(run_cli("--input", "synthetic:rmat:scale=x", "--num-parts", 2, "--out", tmp_path / "o"),
                          "scale=x is not an integer")
    assert_one_line_error(run_cli("--input", "synthetic:rmat:colour=3", "--num-parts", 2, "--out", tmp_path / "o"),
                          "unknown option(s) colour")


def write_edgelist(tmp_path, lines, feats=None, labels=None):
    edges = tmp_path / "g.txt"
    edges.write_text("# a comment\n" + "\n".join(lines) + "\n")
    spec = f"edgelist:{edges}"
    if feats is not None:
        np.save(tmp_path / "f.npy", feats)
        spec += f",feat={tmp_path / 'f.npy'}"
    if labels is not None:
        np.save(tmp_path / "l.npy", labels)
        spec += f",label={tmp_path / 'l.npy'}"
    return spec


def test_count_mismatch(tmp_path):
    spec = write_edgelist(tmp_path, ["0 1", "1 2"], feats=np.ones((5, 3), np.float32), labels=np.zeros(6, np.int64))
    assert_one_line_error(run_cli("--input", spec, "--num-parts", 2, "--out", tmp_path / "o"),
                          "l.npy", "has 6 labels, expected 5")


def test_nan_features(tmp_path):
    feats = np.ones((5, 3), np.float32)
    feats[3, 1] = np.nan
    spec = write_edgelist(tmp_path, ["0 1", "1 2"], feats=feats, labels=np.zeros(5, np.int64))
    assert_one_line_error(run_cli("--input", spec, "--num-parts", 2, "--out", tmp_path / "o"),
                          "features of node 3 contain NaN or inf")


def test_label_out_of_range(tmp_path):
    path = tmp_path / "g.npz"
    np.savez(path, edge_index=np.array([[0, 1, 2], [1, 2, 3]]), features=np.ones((4, 2), np.float32),
             labels=np.array([0, 1, -3, 1]))
    assert_one_line_error(run_cli("--input", f"npz:{path}", "--num-parts", 2, "--out", tmp_path / "o"),
                          str(path), "label -3 of node 2 is out of range")


def test_ids_out_of_range(tmp_path):
    spec = write_edgelist(tmp_path, ["0 1", "1 7"], feats=np.ones((5, 3), np.float32))
    assert_one_line_error(run_cli("--input", spec, "--num-parts", 2, "--out", tmp_path / "o"),
                          "g.txt", "edge destination id 7 is out of range [0, 5)")
    spec = write_edgelist(tmp_path, ["0 1", "-1 2"], feats=np.ones((5, 3), np.float32))
    assert_one_line_error(run_cli("--input", spec, "--num-parts", 2, "--out", tmp_path / "o"), "edge source id -1")


def test_malformed_edge_file(tmp_path):
    spec = write_edgelist(tmp_path, ["0 1", "1 two"])
    assert_one_line_error(run_cli("--input", spec, "--num-parts", 2, "--out", tmp_path / "o"), "g.txt", "integer node ids")


def test_num_parts_out_of_range(tmp_path):
    assert_one_line_error(run_cli("--input", SBM, "--num-parts", 0, "--out", tmp_path / "o"), "--num-parts")
    assert_one_line_error(run_cli("--input", SBM, "--num-parts", 601, "--out", tmp_path / "o"), "--num-parts", "[1, 600]")


def test_refuses_non_empty_out_without_force(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    proc = run_cli("--input", SBM, "--num-parts", 2, "--out", out)
    assert_one_line_error(proc, str(out), "not empty", "--force")
    # --force only ever replaces a partition directory, never other data
    assert_one_line_error(run_cli("--input", SBM, "--num-parts", 2, "--out", out, "--force"), "refusing")
    assert (out / "notes.txt").read_text() == "precious"


def test_force_replaces_a_partition_dir(tmp_path):
    out = tmp_path / "parts"
    assert run_cli("--input", SBM, "--num-parts", 2, "--out", out, "--method", "random").returncode == 0
    assert run_cli("--input", SBM, "--num-parts", 3, "--out", out, "--method", "random").returncode == 2
    proc = run_cli("--input", SBM, "--num-parts", 3, "--out", out, "--method", "random", "--force")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / METADATA_FILE).read_text())["num_parts"] == 3
    assert run_cli("verify", out).returncode == 0
    assert not no_leftovers(tmp_path)


def test_failure_mid_write_leaves_nothing(tmp_path, monkeypatch):
    """A crash while writing part 1 leaves neither a half-written --out nor temp files, and an
    existing partition directory being replaced stays intact."""
    from partitioning import partition
    from partitioning.sources import load_spec

    graph = load_spec(SBM)
    out = tmp_path / "parts"
    real_write = partition.write_partition_file

    def failing_write(path, **kw):
        if kw["part_id"] == 1:
            raise OSError(28, "No space left on device")
        return real_write(path, **kw)

    monkeypatch.setattr(partition, "write_partition_file", failing_write)
    with pytest.raises(OSError):
        partition.partition_graph(graph, 3, str(out), method="random")
    assert not out.exists() and not no_leftovers(tmp_path)
    monkeypatch.setattr(partition, "write_partition_file", real_write)
    partition.partition_graph(graph, 2, str(out), method="random")
    before = {f: sha256_file(out / f) for f in os.listdir(out)}
    monkeypatch.setattr(partition, "write_partition_file", failing_write)
    with pytest.raises(OSError):
        partition.partition_graph(graph, 3, str(out), method="random", force=True)
    assert {f: sha256_file(out / f) for f in os.listdir(out)} == before
    assert not no_leftovers(tmp_path)


def test_refuses_code_in_pickles(cora_copy, tmp_path):
    class Exploit:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    with open(cora_copy / "ind.cora.graph", "wb") as f:
        pickle.dump(Exploit(), f)
    proc = run_cli("--input", f"planetoid:{cora_copy}:cora", "--num-parts", 2, "--out", tmp_path / "o")
    assert_one_line_error(proc, "ind.cora.graph", "refusing to load")
    assert not (tmp_path / "pwned").exists()


# ----------------------------------------------------------------------------- verify
@pytest.fixture
def parts_dir(tmp_path):
    out = tmp_path / "parts"
    assert run_cli("--input", SBM, "--num-parts", 3, "--out", out).returncode == 0
    return out


def reseal(directory, part_file):
    """Update the metadata checksum after tampering, so verify must find the damage itself."""
    meta_path = directory / METADATA_FILE
    meta = json.loads(meta_path.read_text())
    for p in meta["parts"]:
        if p["file"] == part_file:
            p["sha256"] = sha256_file(directory / part_file)
    meta_path.write_text(json.dumps(meta))


def verify_error(directory, *needles):
    proc = run_cli("verify", directory)
    assert_one_line_error(proc, *needles)
    assert proc.returncode == 2


def test_verify_detects_corruption(parts_dir):
    path = parts_dir / "part-00001.h5"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    verify_error(parts_dir, "part-00001.h5", "sha256")


def test_verify_detects_moved_edge(parts_dir):
    with h5py.File(parts_dir / "part-00000.h5", "r+") as f:
        idx = f["csr/indices"][()]
        idx[0] = (idx[0] + 1) % 600
        f["csr/indices"][...] = idx
    reseal(parts_dir, "part-00000.h5")
    verify_error(parts_dir, "part-00000.h5")


def test_verify_detects_wrong_halo_degree(parts_dir):
    with h5py.File(parts_dir / "part-00002.h5", "r+") as f:
        f["halo/in_degree"][0] += 1
    reseal(parts_dir, "part-00002.h5")
    verify_error(parts_dir, "part-00002.h5", "halo/in_degree")


def test_verify_detects_nan(parts_dir):
    with h5py.File(parts_dir / "part-00000.h5", "r+") as f:
        f["features"][5, 0] = np.nan
    reseal(parts_dir, "part-00000.h5")
    verify_error(parts_dir, "part-00000.h5", "NaN")


def test_verify_missing_part_and_foreign_dirs(parts_dir, tmp_path):
    os.remove(parts_dir / "part-00001.h5")
    verify_error(parts_dir, "part-00001.h5", "missing")
    verify_error(tmp_path, "metadata.json", "missing")
    verify_error(tmp_path / "nowhere", "not a directory")
    (tmp_path / METADATA_FILE).write_text(json.dumps({"format": "rudder-partitions", "format_version": 99}))
    verify_error(tmp_path, "format version 99 is not supported")


# ----------------------------------------------------------------------------- feature storage types
def test_bad_feature_dtype_is_one_line(tmp_path):
    proc = run_cli("--input", SBM, "--num-parts", 2, "--out", tmp_path / "o", "--feature-dtype", "int4")
    assert_one_line_error(proc, "--feature-dtype", "'int4' is not one of auto, float32, float16, bfloat16, uint8, bits")
    assert not (tmp_path / "o").exists()


def test_feature_dtype_recorded(tmp_path):
    """auto stores Cora's 0/1 rows as bits; an explicit lossy type is written and says so."""
    out = tmp_path / "cora"
    proc = run_cli("--input", f"planetoid:{BUNDLED_CORA}:cora", "--num-parts", 2, "--out", out)
    assert proc.returncode == 0 and "features stored as bits (auto): 180 bytes a row" in proc.stdout, proc.stderr
    meta = json.loads((out / METADATA_FILE).read_text())
    assert (meta["feature_dtype"], meta["feature_lossless"], meta["feature_max_abs_error"]) == ("bits", True, 0.0)
    with h5py.File(out / "part-00000.h5", "r") as f:
        assert f.attrs["feature_dtype"] == "bits" and f["features"].dtype == np.uint8 and f["features"].shape[1] == 180
    assert run_cli("verify", out).returncode == 0
    out = tmp_path / "sbm"
    proc = run_cli("--input", SBM, "--num-parts", 2, "--out", out, "--feature-dtype", "float16")
    assert proc.returncode == 0 and "features stored as float16 (float16): 8 bytes a row" in proc.stdout
    assert "LOSSY" in proc.stdout
    meta = json.loads((out / METADATA_FILE).read_text())
    assert meta["feature_dtype"] == "float16" and not meta["feature_lossless"] and 0 < meta["feature_max_abs_error"] < 0.01
    assert run_cli("verify", out).returncode == 0


def test_old_directory_reads_as_float32(parts_dir):
    """A directory written before the storage types (no metadata field, no file attribute) reads
    as float32, and verify accepts it."""
    from rudder.data.partition_store import PartitionMeta, read_features, read_stored_features

    before = [read_features(str(parts_dir), p) for p in range(3)]
    meta_path = parts_dir / METADATA_FILE
    meta = json.loads(meta_path.read_text())
    for key in ("feature_dtype", "feature_lossless", "feature_max_abs_error"):
        del meta[key]
    meta_path.write_text(json.dumps(meta))
    for p in range(3):
        with h5py.File(parts_dir / f"part-0000{p}.h5", "r+") as f:
            del f.attrs["feature_dtype"]
        reseal(parts_dir, f"part-0000{p}.h5")
    assert PartitionMeta.load(str(parts_dir)).feature_dtype == "float32"
    for p in range(3):
        assert read_stored_features(str(parts_dir), p).dtype == np.float32
        np.testing.assert_array_equal(read_features(str(parts_dir), p), before[p])
    assert run_cli("verify", parts_dir).returncode == 0


def test_verify_detects_feature_dtype_damage(tmp_path, parts_dir):
    meta_path = parts_dir / METADATA_FILE
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(dict(meta, feature_dtype="bits")))
    verify_error(parts_dir, "part-00000.h5", "features stored as float32, metadata.json says bits")
    meta_path.write_text(json.dumps(dict(meta, feature_dtype="int4")))
    verify_error(parts_dir, "metadata.json", "feature_dtype 'int4' is not one of")
    out = tmp_path / "cora"  # 1,433 columns: the last byte of a bits row has 7 padding bits
    assert run_cli("--input", f"planetoid:{BUNDLED_CORA}:cora", "--num-parts", 2, "--out", out).returncode == 0
    with h5py.File(out / "part-00001.h5", "r+") as f:
        f["features"][3, -1] |= 1
    reseal(out, "part-00001.h5")
    verify_error(out, "part-00001.h5", "padding bits set")


# ----------------------------------------------------------------------------- the memory model
def plan_figures(text):
    peak = float(re.search(r"predicted peak memory ([\d.]+) GiB", text).group(1))
    per_edge = float(re.search(r"([\d.]+) bytes a directed edge", text).group(1))
    disk = float(re.search(r"predicted disk ([\d.]+) GiB", text).group(1))
    return peak, per_edge, disk


def test_plan_predicts_without_running(tmp_path):
    """--plan reads no graph and writes nothing: papers100M's figures from its sizes, an RMAT's from
    its spec; the parallel mode shortens only the write phase; a missing input is one line."""
    papers = run_cli("--plan", "--like", "papers100M", "--num-parts", 256)
    assert papers.returncode == 0, papers.stderr
    peak, per_edge, disk = plan_figures(papers.stdout)
    assert 20 < peak < 300 and 4 < per_edge < 80 and 53 < disk < 120  # 57 GB (53 GiB) of features alone
    wide = run_cli("--plan", "--like", "papers100M", "--num-parts", 256, "--ranks", 8)
    assert plan_figures(wide.stdout)[0] == peak
    seconds = [float(re.search(r"predicted time (\d+) s", p.stdout).group(1)) for p in (papers, wide)]
    assert seconds[1] < seconds[0]
    rmat = run_cli("--plan", "--input", "synthetic:rmat:scale=20,edge_factor=16,feat_dim=128,seed=1", "--num-parts", 8,
                   "--out", tmp_path / "never")
    assert rmat.returncode == 0 and "1048576 nodes, 33554432 directed edges" in rmat.stdout
    assert plan_figures(rmat.stdout)[0] < peak and not (tmp_path / "never").exists()
    # METIS's levels on disk (the default) against in memory, where how fast a graph coarsens
    # decides their sum: the plan budgets the slowest measured coarsening and names the peak at the
    # fastest; the multilevel path (papers100M) holds no METIS levels of the whole graph
    in_memory = run_cli("--plan", "--input", "synthetic:rmat:scale=20,edge_factor=16,feat_dim=128,seed=1",
                        "--num-parts", 8, "--metis-levels", "memory")
    fast = float(re.search(r"coarsens fast needs less: ([\d.]+) GiB", in_memory.stdout).group(1))
    assert plan_figures(rmat.stdout)[0] < fast < plan_figures(in_memory.stdout)[0]
    assert "coarsens fast" not in rmat.stdout and "coarsens fast" not in papers.stdout
    assert "of coarse levels (METIS's, --metis-levels disk)" in rmat.stdout
    assert "coarse levels" not in in_memory.stdout.split("predicted disk")[1]
    # a reader that went away (`| head`) ends the tool quietly, as SIGPIPE ends other tools
    piped = subprocess.Popen([sys.executable, "-m", "partitioning", "--plan", "--like", "papers100M", "--num-parts", "8"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    piped.stdout.close()  # before the tool writes: its first write finds no reader
    assert piped.wait(timeout=60) == 128 + signal.SIGPIPE and piped.stderr.read() == ""
    assert_one_line_error(run_cli("--plan", "--num-parts", 8), "--plan", "needs exactly one of --input SPEC or --like")
    assert_one_line_error(run_cli("--plan", "--input", f"planetoid:{BUNDLED_CORA}:cora", "--num-parts", 8),
                          "--plan", "not known without loading")
