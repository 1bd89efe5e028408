"""The weight cache's file format (runtime/cache_file.py): arrays written once and read back as
aligned, read-only views of a shared mapping; a stale, truncated or corrupt file is refused, never
used; writers racing on one path each publish a whole file."""

import multiprocessing
import os

import numpy as np
import pytest

from nnrun.cache_file import ALIGNMENT, HEADER, PAGE, CacheFile, CacheFileError, CacheWriter

KEY = "model=abc123;nnrun=0.1.0;format=1"


def arrays():
    rng = np.random.default_rng(0)
    return {"conv1/w": rng.standard_normal((64, 3, 7, 7)).astype(np.float32),
            "fc/b": rng.standard_normal(10).astype(np.float32),
            "q": rng.integers(-128, 128, (5, 3)).astype(np.int8),
            "empty": np.zeros((0, 4), np.float16),
            "big": rng.standard_normal(40_000).astype(np.float64)}


def write(path, key=KEY, items=None):
    with CacheWriter(path, key) as writer:
        for name, a in (items or arrays()).items():
            writer.add(name, a)
    return path


def test_arrays_come_back_equal_aligned_and_read_only(tmp_path):
    path = write(tmp_path / "w.cache")
    cache = CacheFile(path, KEY)
    assert sorted(cache.names()) == sorted(arrays())
    base = np.frombuffer(cache._buffer, np.uint8).__array_interface__["data"][0]  # the mapping's start
    for name, want in arrays().items():
        got = cache.array(name)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert not got.flags.writeable
        if got.size:
            assert (got.__array_interface__["data"][0] - base) % ALIGNMENT == 0
    big = cache.array("big")
    assert (big.__array_interface__["data"][0] - base) % PAGE == 0  # a large array starts on a page
    assert os.listdir(tmp_path) == ["w.cache"]  # the temporary file was renamed into place


def test_another_key_is_refused(tmp_path):
    path = write(tmp_path / "w.cache")
    with pytest.raises(CacheFileError, match="another key"):
        CacheFile(path, KEY + ";changed")


@pytest.mark.parametrize("damage", ["truncate_header", "truncate_index", "magic", "version", "index_byte",
                                    "payload_byte", "empty"])
def test_a_damaged_file_is_refused(tmp_path, damage):
    path = write(tmp_path / "w.cache")
    data = bytearray(path.read_bytes())
    _, _, _, _, index_offset, index_length = HEADER.unpack_from(data, 0)
    if damage == "truncate_header":
        data = data[:HEADER.size - 1]
    elif damage == "truncate_index":
        data = data[:index_offset + index_length // 2]
    elif damage == "magic":
        data[0] ^= 0xFF
    elif damage == "version":
        data[8] += 1
    elif damage == "index_byte":
        data[index_offset + 3] ^= 0x01
    elif damage == "payload_byte":
        data[HEADER.size + 5] ^= 0x01  # inside the first array
    elif damage == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(CacheFileError):
        cache = CacheFile(path, KEY)
        for name in cache.names():
            cache.array(name)


def test_an_index_that_lies_about_an_extent_is_refused(tmp_path):
    """A well-formed index whose array runs past the payloads: checked before any view is made."""
    import json
    import struct
    import zlib

    path = write(tmp_path / "w.cache", items={"a": np.arange(4, dtype=np.float32)})
    data = bytearray(path.read_bytes())
    magic, version, _, digest, index_offset, _ = HEADER.unpack_from(data, 0)
    table = json.loads(bytes(data[index_offset:]))
    table["entries"][0]["nbytes"] = 1 << 40
    table["entries"][0]["shape"] = [1 << 38]
    index = json.dumps(table).encode()
    data = data[:index_offset] + index
    struct.pack_into(HEADER.format, data, 0, magic, version, zlib.crc32(index), digest, index_offset, len(index))
    path.write_bytes(bytes(data))
    with pytest.raises(CacheFileError, match="misplaced"):
        CacheFile(path, KEY)


def test_an_aborted_writer_leaves_nothing(tmp_path):
    path = tmp_path / "w.cache"
    with pytest.raises(RuntimeError):
        with CacheWriter(path, KEY) as writer:
            writer.add("a", np.ones(3, np.float32))
            raise RuntimeError("packing failed")
    assert os.listdir(tmp_path) == []


def _race(path):
    write(path, items={"w": np.full((256, 256), 1.5, np.float32)})  # one key: the same bytes


def test_writers_racing_on_one_path_publish_one_valid_file(tmp_path):
    path = tmp_path / "w.cache"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_race, args=(path,)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    cache = CacheFile(path, KEY)
    np.testing.assert_array_equal(cache.array("w"), np.full((256, 256), 1.5, np.float32))
    assert os.listdir(tmp_path) == ["w.cache"]  # no temporary file left behind


def test_a_settled_file_that_passed_is_stamped_and_not_read_again(tmp_path, monkeypatch):
    from nnrun import cache_file

    path = write(tmp_path / "w.cache")
    CacheFile(path, KEY).verify()
    assert not os.path.exists(f"{path}.verified")  # just written: not settled, so not stamped
    monkeypatch.setattr(cache_file, "SETTLED_S", 0.0)
    CacheFile(path, KEY).verify()
    assert os.path.exists(f"{path}.verified")
    summed = []
    monkeypatch.setattr(cache_file, "checksum", lambda data: summed.append(len(data)))
    cache = CacheFile(path, KEY)
    cache.verify()
    for name, want in arrays().items():
        np.testing.assert_array_equal(cache.array(name), want)
    assert summed == []  # the stamp vouches for every array


def test_the_checksum_sees_a_flipped_bit_and_swapped_blocks():
    from nnrun.cache_file import checksum

    data = np.random.default_rng(1).integers(0, 256, 3 * PAGE + 5, dtype=np.uint8)
    want = checksum(data)
    flipped = data.copy()
    flipped[PAGE + 100] ^= 0x04
    swapped = np.concatenate([data[PAGE:2 * PAGE], data[:PAGE], data[2 * PAGE:]])
    tail = data.copy()
    tail[-1] ^= 1
    for other in (flipped, swapped, tail, data[:-1]):
        assert checksum(other) != want
    assert checksum(data.copy()) == want


def test_a_stamp_does_not_vouch_for_a_file_put_in_its_place(tmp_path, monkeypatch):
    from nnrun import cache_file

    monkeypatch.setattr(cache_file, "SETTLED_S", 0.0)
    path = write(tmp_path / "w.cache")
    CacheFile(path, KEY).verify()
    assert os.path.exists(f"{path}.verified")
    write(path)  # another file (another inode) under the same name, then damaged
    data = bytearray(path.read_bytes())
    data[PAGE + 8] ^= 0x40  # inside conv1/w, the first array
    with open(path, "r+b") as f:
        f.write(data)
    with pytest.raises(CacheFileError, match="checksum"):
        CacheFile(path, KEY).verify()


def test_a_stamp_that_cannot_be_written_is_left_out_silently(tmp_path, monkeypatch):
    import errno

    from nnrun import cache_file

    monkeypatch.setattr(cache_file, "SETTLED_S", 0.0)
    path = write(tmp_path / "w.cache")

    def read_only(*args):
        raise OSError(errno.EROFS, "Read-only file system")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", read_only)
        CacheFile(path, KEY).verify()  # passes, and says nothing
    assert sorted(os.listdir(tmp_path)) == ["w.cache"]  # no stamp, no temporary file left
