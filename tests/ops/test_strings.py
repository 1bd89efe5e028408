"""String ops and TfIdfVectorizer against onnxruntime (RE2 for RegexFullMatch) and onnx's reference
evaluator; StringNormalizer's non-ASCII case changes against the spec written out in Python."""

import numpy as np
import pytest
from oracle import TensorProto, check_model, helper, make_model, run_nnrun, run_onnxruntime

import nnrun

STRING = TensorProto.STRING


def strings(*values, shape=None):
    a = np.array(list(values), dtype=object)
    return a.reshape(shape) if shape is not None else a


def one_node(op_type, inputs, n_outputs=1, opset=20, **attrs):
    """A model of one node over (name, array) inputs; outputs y0, y1, ... of any type."""
    node = helper.make_node(op_type, [n for n, _ in inputs], [f"y{i}" for i in range(n_outputs)], **attrs)
    return make_model([node], inputs, [(f"y{i}", None) for i in range(n_outputs)], opset=opset)


def check_both(model, feeds):
    """The same outputs as onnxruntime and as the reference evaluator."""
    check_model(model, feeds, oracle="onnxruntime")
    check_model(model, feeds, oracle="reference")


# StringConcat

@pytest.mark.parametrize("x, y", [
    (strings("a", "bc", ""), strings("x", "", "yz")),
    (strings("cat", "dog", shape=(2, 1)), strings("s", "!", "?")),  # broadcast to (2, 3)
    (np.array("one", dtype=object), strings("", "two")),
    (strings("é", "中", "😀"), strings("文", "e\u0301", "\t")),
    (strings(shape=(0, 2)), strings("a", "b")),
])
def test_string_concat(x, y):
    check_both(one_node("StringConcat", [("x", x), ("y", y)]), {"x": x, "y": y})


def test_string_concat_of_computed_strings():
    # Strings made by one node and read by the next are not arena bytes: each run makes them anew.
    x, y = strings("a", "b", "c"), strings("1", "2", "3")
    nodes = [helper.make_node("StringConcat", ["x", "y"], ["xy"]),
             helper.make_node("StringConcat", ["xy", "x"], ["xyx"]),
             helper.make_node("RegexFullMatch", ["xyx"], ["m"], pattern="[ab]2?[ab]")]
    model = make_model(nodes, [("x", x), ("y", y)], [("xyx", None), ("m", None)], opset=20)
    check_both(model, {"x": x, "y": y})
    sess = nnrun.InferenceSession(model.SerializeToString())
    first = sess.run(None, {"x": x, "y": y})[0].copy()
    sess.run(None, {"x": y, "y": x})
    np.testing.assert_array_equal(first, strings("a1a", "b2b", "c3c"))


def test_string_concat_refuses_numbers():
    model = one_node("StringConcat", [("x", strings("a")), ("y", np.zeros(1, np.float32))])
    with pytest.raises(nnrun.NnrunError, match="string tensor"):
        run_nnrun(model, {"x": strings("a"), "y": np.zeros(1, np.float32)})


# StringSplit

SPLIT_INPUTS = [
    strings("a.b.c", "", "..", "x"),
    strings("  hello   world ! ", "\tone\ntwo", "", "   ", shape=(2, 2)),
    strings("o-n-n--x-", "-", "a--b"),
    strings(shape=(3, 0)),
    np.array("a b", dtype=object),
]


@pytest.mark.parametrize("x", SPLIT_INPUTS[:-1])  # the reference evaluator fails on a scalar
@pytest.mark.parametrize("delimiter", [None, "", ".", "-", "--", " "])
@pytest.mark.parametrize("maxsplit", [None, 0, 1, 2])
def test_string_split(x, delimiter, maxsplit):
    attrs = {}
    if delimiter is not None:
        attrs["delimiter"] = delimiter
    if maxsplit is not None:
        attrs["maxsplit"] = maxsplit
    check_model(one_node("StringSplit", [("x", x)], n_outputs=2, **attrs), {"x": x}, oracle="reference")


@pytest.mark.parametrize("delimiter", [None, "."])
@pytest.mark.parametrize("x", [strings("a.b.c", "x.y", "  p q ", "z"), SPLIT_INPUTS[-1]])
def test_string_split_against_onnxruntime(x, delimiter):
    attrs = {} if delimiter is None else {"delimiter": delimiter}
    check_model(one_node("StringSplit", [("x", x)], n_outputs=2, **attrs), {"x": x}, oracle="onnxruntime")


def test_string_split_of_a_constant_folds():
    nodes = [helper.make_node("Constant", [], ["w"], value=helper.make_tensor("w", STRING, [2], [b"a b", b"c"])),
             helper.make_node("StringSplit", ["w"], ["parts", "n"]),
             helper.make_node("StringConcat", ["parts", "x"], ["y"])]
    x = strings("!")
    model = make_model(nodes, [("x", x)], [("y", None), ("n", None)], opset=20)
    check_model(model, {"x": x}, oracle="reference")


# StringNormalizer

NORMALIZER_INPUTS = [
    strings("monday", "Tuesday", "MONDAY", "wednesday", "", "Monday"),
    strings("Monday", "tuesday", "monday", shape=(1, 3)),
    strings("monday", "monday"),
    strings("monday", shape=(1, 1)),
]


@pytest.mark.parametrize("x", NORMALIZER_INPUTS)
@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("case_sensitive", [0, 1])
@pytest.mark.parametrize("stopwords", [None, ["monday"], ["Monday", "WEDNESDAY", "absent"]])
def test_string_normalizer(x, action, case_sensitive, stopwords):
    attrs = {"case_change_action": action, "is_case_sensitive": case_sensitive,
             "locale": "C"}  # onnxruntime fails on a locale the machine does not have; C is everywhere
    if stopwords is not None:
        attrs["stopwords"] = stopwords
    check_model(one_node("StringNormalizer", [("x", x)], opset=10, **attrs), {"x": x}, oracle="onnxruntime")


def _simple(change, s):
    return "".join(change(c) if len(change(c)) == 1 else c for c in s)


@pytest.mark.parametrize("action", ["LOWER", "UPPER"])
def test_string_normalizer_beyond_ascii(action):
    # The spec names no case mapping, and onnxruntime's follows the process's C locale. nnrun
    # takes Unicode's simple mapping, one character for one (so "ß" stays "ß" in upper case);
    # the oracle is that rule written out here. Stop words compare after the same lower-casing.
    x = strings("Été", "ÉTÉ", "straße", "ΣΑΣ", "ǅungla", "İx", "ﬁ", "Ωmega", shape=(1, 8))
    stops = ["été", "ωMEGA"]
    change = str.upper if action == "UPPER" else str.lower
    folded = {_simple(str.lower, s) for s in stops}
    kept = [_simple(change, s) for s in x.reshape(-1) if _simple(str.lower, s) not in folded]
    model = one_node("StringNormalizer", [("x", x)], opset=10, case_change_action=action, stopwords=stops)
    (y,) = run_nnrun(model, {"x": x})
    np.testing.assert_array_equal(y, np.array([kept], dtype=object))


def test_string_normalizer_refuses_a_matrix():
    x = strings("a", "b", "c", "d", shape=(2, 2))
    with pytest.raises(nnrun.NnrunError, match=r"expected \[C\] or \[1, C\]"):
        run_nnrun(one_node("StringNormalizer", [("x", x)], opset=10), {"x": x})


# RegexFullMatch

REGEX_CASES = [
    (r"www\.[\w.-]+\.\bcom\b", strings("www.google.com", "www.bbc.co.uk", "www..com", "")),
    (r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)", strings("a@gmail.com", "a@hotmail.com", " b@yahoo.com ",
                                                                shape=(3, 1))),
    (r"a|ab", strings("a", "ab", "abc")),  # full match: alternation tried to the end, not the first branch
    (r"\d+", strings("123", "12a", "", "٣", "１２")),  # ASCII digits only, as in RE2
    (r"\w+\s\w+", strings("ab cd", "é cd", "ab\u00a0cd")),  # \w and \s are ASCII in RE2 too
    (r"(?i)hello", strings("HeLLo", "hello!", "HELLO")),
    (r"x*", strings(shape=(2, 0))),
    (r".+", strings("line\n", "line")),  # '.' does not match a newline
]


@pytest.mark.parametrize("pattern, x", REGEX_CASES)
def test_regex_full_match(pattern, x):
    check_model(one_node("RegexFullMatch", [("x", x)], pattern=pattern), {"x": x}, oracle="onnxruntime")


@pytest.mark.parametrize("pattern, x", [c for c in REGEX_CASES if c[0] not in (r"\d+", r"\w+\s\w+")])
def test_regex_full_match_as_the_reference(pattern, x):
    # The reference evaluator uses Python's re without re.ASCII: it agrees where the input is ASCII.
    check_model(one_node("RegexFullMatch", [("x", x)], pattern=pattern), {"x": x}, oracle="reference")


def test_regex_full_match_refuses_a_bad_pattern():
    x = strings("a")
    with pytest.raises(nnrun.NnrunError, match="not a valid regular expression"):
        run_nnrun(one_node("RegexFullMatch", [("x", x)], pattern="(unclosed"), {"x": x})


# TfIdfVectorizer

POOL_INTS = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7]  # 1-grams 2 3 5 4, 2-grams (5 6) (7 8) (6 7)
TFIDF_CASES = [
    dict(min_gram_length=2, max_gram_length=2, max_skip_count=0),
    dict(min_gram_length=2, max_gram_length=2, max_skip_count=5),
    dict(min_gram_length=1, max_gram_length=2, max_skip_count=5),
    dict(min_gram_length=1, max_gram_length=1, max_skip_count=3),
    dict(min_gram_length=1, max_gram_length=2, max_skip_count=1),
]


def _tfidf(x, mode="TF", weights=None, pool_ints=None, pool_strings=None, counts=(0, 4),
           indexes=(0, 1, 2, 3, 4, 5, 6), **grams):
    attrs = dict(mode=mode, ngram_counts=list(counts), ngram_indexes=list(indexes), **grams)
    if pool_ints is not None:
        attrs["pool_int64s"] = pool_ints
    if pool_strings is not None:
        attrs["pool_strings"] = pool_strings
    if weights is not None:
        attrs["weights"] = weights
    return one_node("TfIdfVectorizer", [("x", x)], opset=9, **attrs)


@pytest.mark.parametrize("grams", TFIDF_CASES)
@pytest.mark.parametrize("mode, weights", [("TF", None), ("IDF", None), ("TFIDF", None),
                                           ("IDF", [0.5, 1.5, 2.0, 0.25, 3.0, 1.0, 0.75]),
                                           ("TFIDF", [0.5, 1.5, 2.0, 0.25, 3.0, 1.0, 0.75])])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(12,), (2, 6), (3, 4)])
def test_tfidf_vectorizer(shape, dtype, mode, weights, grams):
    x = np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], dtype=dtype).reshape(shape)
    model = _tfidf(x, mode, weights, pool_ints=POOL_INTS, **grams)
    check_model(model, {"x": x}, oracle="onnxruntime")
    if mode == "TF" or weights is not None:  # the reference evaluator fails without weights
        check_model(model, {"x": x}, oracle="reference")


def test_tfidf_vectorizer_strings_and_shuffled_indexes():
    x = strings("a", "b", "c", "a", "b", "d", "c", "a", "b", shape=(1, 9))
    model = _tfidf(x, "TF", pool_strings=["a", "b", "c", "a", "b", "b", "c"], counts=(0, 3),
                   indexes=(4, 0, 2, 5, 1), min_gram_length=1, max_gram_length=2, max_skip_count=2)
    check_model(model, {"x": x}, oracle="onnxruntime")
    check_model(model, {"x": x}, oracle="reference")


def test_tfidf_vectorizer_refuses_a_repeated_ngram():
    # onnxruntime refuses it too ("Duplicate ngram detected"); the spec gives it no meaning.
    x = strings("a", "b")
    model = _tfidf(x, "TF", pool_strings=["a", "b", "a", "b", "a", "b"], counts=(0, 2),
                   indexes=(0, 1, 2, 3), min_gram_length=1, max_gram_length=2, max_skip_count=0)
    with pytest.raises(nnrun.NnrunError, match="repeats the 2-gram"):
        run_nnrun(model, {"x": x})


def test_tfidf_vectorizer_random_against_onnxruntime():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 6, size=(4, 30)).astype(np.int64)
    pairs = rng.permutation([(a, b) for a in range(6) for b in range(6)])[:8]
    triples = rng.permutation([(a, b, c) for a in range(6) for b in range(6) for c in range(6)])[:4]
    pool = list(range(6)) + [int(v) for v in pairs.reshape(-1)] + [int(v) for v in triples.reshape(-1)]
    indexes = [int(v) for v in rng.permutation(6 + 8 + 4)]
    model = _tfidf(x, "TFIDF", [float(v) for v in rng.uniform(0.1, 2, 18)], pool_ints=pool, counts=(0, 6, 22),
                   indexes=indexes, min_gram_length=1, max_gram_length=3, max_skip_count=2)
    np.testing.assert_allclose(run_nnrun(model, {"x": x})[0], run_onnxruntime(model, {"x": x})[0], rtol=1e-6)
