"""Feature storage types (rudder.data.feature_encoding): each stores what it claims exactly and
widens it back bit for bit, into any rows of an input matrix; ``auto`` takes the smallest exact
type and never a lossy one; an explicit lossy choice is measured."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rudder.data.feature_encoding import AUTO_ORDER, STORAGE_TYPES, FeatureEncoding, choose_encoding

RNG = np.random.default_rng(7)
NORMAL = RNG.standard_normal((300, 37)).astype(np.float32)  # 37: bits rows end in a partial byte
BINARY = (RNG.random((300, 37)) < 0.1).astype(np.float32)


def exact_values(name: str) -> np.ndarray:
    """A matrix that type ``name`` holds exactly, and no smaller type does."""
    if name == "bits":
        return BINARY
    if name == "uint8":
        return RNG.integers(0, 256, (300, 37)).astype(np.float32)
    if name == "float16":
        return NORMAL.astype(np.float16).astype(np.float32)
    if name == "bfloat16":  # halves cannot hold 1e10
        return torch.from_numpy(NORMAL * 1e10).to(torch.bfloat16).float().numpy()
    return NORMAL


def bits_of(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name", STORAGE_TYPES)
def test_each_type_round_trips_what_it_holds(name):
    x = exact_values(name)
    enc = FeatureEncoding(name, x.shape[1])
    stored = enc.encode(x)
    assert stored.dtype == enc.stored_dtype and stored.shape == (x.shape[0], enc.width)
    assert stored.nbytes == x.shape[0] * enc.row_bytes
    np.testing.assert_array_equal(bits_of(enc.decode(stored)), bits_of(x))
    assert enc.compare(x) == (True, 0.0)


@pytest.mark.parametrize("name", STORAGE_TYPES)
def test_decode_into_rows_of_a_bigger_matrix(name):
    """Into a contiguous range and into scattered rows; the other rows stay as they were."""
    x = exact_values(name)[:6]
    enc = FeatureEncoding(name, x.shape[1])
    stored = enc.encode(x)
    for at in (np.arange(4, 10), np.array([0, 3, 4, 9, 11, 12])):
        out = np.full((14, x.shape[1]), -3.0, np.float32)
        assert enc.decode(stored, out, at) is out
        np.testing.assert_array_equal(bits_of(out[at]), bits_of(x))
        assert (np.delete(out, at, axis=0) == -3.0).all()
    out = np.full((8, x.shape[1]), -3.0, np.float32)
    enc.decode(stored, out)  # no rows given: the first ones
    np.testing.assert_array_equal(out[:6], x)
    assert (out[6:] == -3.0).all()


def test_bits_decode_a_block_at_a_time_as_at_once():
    """Bits rows are unpacked in blocks of about 1 MB of bits: a read of several blocks (and a last
    partial one), into consecutive and into scattered rows, widens to what unpacking it whole gives."""
    dim = 4714  # Facebook's width: 222 rows a block
    x = (RNG.random((500, dim)) < 0.05).astype(np.float32)
    enc = FeatureEncoding("bits", dim)
    stored = enc.encode(x)
    assert 1 < 500 // max(1, (1 << 20) // dim) < 3  # blocks: two whole ones and a partial one
    np.testing.assert_array_equal(bits_of(enc.decode(stored)), bits_of(x))
    at = np.sort(RNG.choice(1200, 500, replace=False))
    out = np.full((1200, dim), -3.0, np.float32)
    enc.decode(stored, out, at)
    np.testing.assert_array_equal(bits_of(out[at]), bits_of(x))
    assert (np.delete(out, at, axis=0) == -3.0).all()


def test_row_sizes():
    """Facebook's 4,714 binary columns: 18,856 bytes a row as float32, 590 as bits."""
    assert [FeatureEncoding(name, 4714).row_bytes for name in STORAGE_TYPES] == [18856, 9428, 9428, 4714, 590]
    assert FeatureEncoding("bits", 8).row_bytes == 1 and FeatureEncoding("bits", 9).row_bytes == 2


@pytest.mark.parametrize("name", AUTO_ORDER)
def test_auto_takes_the_smallest_exact_type(name):
    encoding, lossless, error = choose_encoding(exact_values(name), "auto")
    assert (encoding.name, lossless, error) == (name, True, 0.0)


@pytest.mark.parametrize("x", [
    np.array([[0, 1, 2], [1, 0, 1]], np.float32),  # 2: not bits
    np.array([[0, 1, 256]], np.float32),  # 256: not uint8 (a half, though)
    np.array([[0, 1, -0.0]], np.float32),  # -0.0: not bits nor uint8, whose 0 is +0.0
    np.array([[0.1, 1, 0]], np.float32),  # 0.1: no half, no bfloat16
    np.array([[131072.0, 1]], np.float32),  # beyond the largest half; a bfloat16
    np.array([[1 + 2.0 ** -12, 1]], np.float32),  # 13 significant bits: no half
    np.array([[2.0 ** -20, 0]], np.float32),  # below the halves' subnormals; a bfloat16
    NORMAL, NORMAL * 1e10, NORMAL[:, :1],
])
def test_auto_never_chooses_a_lossy_type(x):
    """Whatever the matrix, the type auto picks gives it back bit for bit, and every smaller type
    would not have."""
    encoding, lossless, _ = choose_encoding(x, "auto")
    assert lossless
    np.testing.assert_array_equal(bits_of(encoding.decode(encoding.encode(x))), bits_of(x))
    for smaller in AUTO_ORDER[:AUTO_ORDER.index(encoding.name)]:
        assert not FeatureEncoding(smaller, x.shape[1]).compare(x)[0], smaller


def test_auto_on_values_float16_cannot_hold():
    assert choose_encoding(np.array([[0.1, 1.0]], np.float32), "auto")[0].name == "float32"
    assert choose_encoding(np.array([[131072.0, 1.0]], np.float32), "auto")[0].name == "bfloat16"
    assert choose_encoding(np.array([[0, 1, 2]], np.float32), "auto")[0].name == "uint8"


def test_explicit_lossy_choice_is_measured():
    enc, lossless, error = choose_encoding(NORMAL, "float16")
    assert enc.name == "float16" and not lossless and 0 < error < 2e-3
    enc, lossless, error = choose_encoding(np.array([[0, 1, 2]], np.float32), "bits")
    assert not lossless and error == 1.0  # 2 is stored as "nonzero", 1
    _, lossless, error = choose_encoding(np.array([[300.0, -2.0, 1.4]], np.float32), "uint8")
    assert not lossless and error == pytest.approx(45.0)  # 300 clips to 255
    enc, lossless, error = choose_encoding(np.array([[1e6, -1e6]], np.float32), "float16")
    assert not lossless and np.isfinite(enc.decode(enc.encode(np.array([[1e6, -1e6]], np.float32)))).all()
    assert choose_encoding(NORMAL, "float32")[1:] == (True, 0.0)


def test_unknown_type():
    with pytest.raises(ValueError, match="int4"):
        FeatureEncoding("int4", 3)
