"""String ops: StringConcat, StringSplit, StringNormalizer, RegexFullMatch, and TfIdfVectorizer,
which counts n-grams of strings or integers.

A string tensor is a numpy array of dtype object holding Python `str`s. Such an array is
references, not bytes, so it never lives in the arena: the compiler gives every string value
an array of its own per run, as it does a graph output. StringSplit's and StringNormalizer's
output shapes follow from their input's values: with a known input, infer returns the values
(the node folds); otherwise it raises NeedsValueError and the node runs eagerly.
"""

import re

import numpy as np

from .elementwise import broadcast_shape
from .registry import REQUIRED, Kernel, TensorInfo, register
from .shape import INT64

STRING = np.dtype(object)


def check_strings(kernel, info, what):
    if info.dtype != STRING:
        kernel.fail(f"input {what} has type {info.dtype}; expected a string tensor")


@register("StringConcat", since=20)
class StringConcat(Kernel):
    def infer(self, x, y):
        check_strings(self, x, "X")
        check_strings(self, y, "Y")
        return [TensorInfo(broadcast_shape(self.node, x.shape, y.shape), STRING)]

    def run(self, x, y, outs, scratch):
        np.add(x, y, out=outs[0])  # str + str on object arrays, broadcast


# StringSplit

@register("StringSplit", since=20)
class StringSplit(Kernel):
    """Python's str.split: no delimiter (or "") splits at runs of whitespace and drops empty
    pieces; a delimiter splits at each occurrence. Rows of fewer pieces are padded with ""."""

    attributes = {"delimiter": None, "maxsplit": None}

    def decode(self):
        self.separator = self.delimiter or None
        self.limit = -1 if self.maxsplit is None else int(self.maxsplit)
        if self.limit < -1:
            self.fail(f"maxsplit must not be negative, got {self.maxsplit}")

    def infer(self, x):
        check_strings(self, x, "X")
        if x.value is None:
            self.needs_value("X")
        return [TensorInfo.of(v) for v in self.split(x.value)]

    def split(self, x):
        pieces = [s.split(self.separator, self.limit) for s in x.reshape(-1)]
        lengths = np.array([len(p) for p in pieces], dtype=INT64).reshape(x.shape)
        width = max((len(p) for p in pieces), default=0)
        substrings = np.full((len(pieces), width), "", dtype=STRING)
        for row, p in zip(substrings, pieces):
            row[:len(p)] = p
        return substrings.reshape(x.shape + (width,)), lengths

    def run(self, x, outs, scratch):
        return self.split(x)


# StringNormalizer

def _simple_case(change):
    """A case change character by character, where one character becomes one (C's towupper and
    towlower, as onnxruntime has them): 'ß' stays 'ß' in upper case rather than becoming 'SS'."""
    def apply(s):
        return "".join(c2 if len(c2 := change(c)) == 1 else c for c in s)
    return apply


CASE_ACTIONS = {"NONE": lambda s: s, "LOWER": _simple_case(str.lower), "UPPER": _simple_case(str.upper)}


@register("StringNormalizer", since=10)
class StringNormalizer(Kernel):
    """Drops the elements that are stop words, then changes their case, as the spec says (and
    onnxruntime does). Case changes by Unicode's simple mapping, one character for one; the
    `locale` attribute is not consulted. onnx's reference evaluator differs from the spec in three ways nnrun does
    not follow: it removes stop words inside each string (split at spaces), drops empty
    strings, and strips accents."""

    attributes = {"case_change_action": "NONE", "is_case_sensitive": 0, "locale": "", "stopwords": ()}

    def decode(self):
        if self.case_change_action not in CASE_ACTIONS:
            self.fail(f"case_change_action {self.case_change_action!r} is not one of "
                      f"{', '.join(CASE_ACTIONS)}")
        self.change_case = CASE_ACTIONS[self.case_change_action]
        self.fold = (lambda s: s) if self.is_case_sensitive else CASE_ACTIONS["LOWER"]
        self.stops = frozenset(self.fold(s) for s in self.stopwords)

    def infer(self, x):
        check_strings(self, x, "X")
        if not (len(x.shape) == 1 or (len(x.shape) == 2 and x.shape[0] == 1)):
            self.fail(f"X has shape {list(x.shape)}; expected [C] or [1, C]")
        if x.value is None:
            self.needs_value("X")
        return [TensorInfo.of(self.normalize(x.value))]

    def normalize(self, x):
        kept = [self.change_case(s) for s in x.reshape(-1) if self.fold(s) not in self.stops]
        # With every element dropped, the output is one empty string: [1] or [1, 1].
        out = np.array(kept or [""], dtype=STRING)
        return out.reshape(x.shape[:-1] + (len(out),))

    def run(self, x, outs, scratch):
        return self.normalize(x)


# RegexFullMatch

@register("RegexFullMatch", since=20)
class RegexFullMatch(Kernel):
    """Whether the whole of each string matches `pattern`, with Python's `re`.

    The spec names RE2's syntax; Python's `re` reads nearly all of it alike. Where they differ:
    - compiled with re.ASCII, so \\d \\w \\s \\b mean ASCII digits, word characters, spaces and
      boundaries, as they do in RE2 (Python alone would match any Unicode digit or letter); a
      case-insensitive (?i) pattern then folds ASCII letters only, where RE2 folds all Unicode.
    - RE2 accepts what Python does not: \\pN and \\p{Greek} classes, [[:alpha:]] POSIX classes
      (Python reads them as plain sets), \\Q...\\E quoting, \\z, and \\C. Such a pattern fails
      or matches differently here.
    - Python accepts what RE2 refuses: backreferences, lookahead and lookbehind, atomic groups
      and possessive repeats, conditionals. A model valid for RE2 has none.
    - RE2 matches in linear time; Python's backtracking may take exponential time on a
      pathological pattern.
    """

    attributes = {"pattern": REQUIRED}

    def decode(self):
        try:
            self.regex = re.compile(self.pattern, re.ASCII)
        except re.error as e:
            self.fail(f"pattern {self.pattern!r} is not a valid regular expression: {e}")

    def infer(self, x):
        check_strings(self, x, "X")
        return [TensorInfo(x.shape, np.dtype(np.bool_))]

    def run(self, x, outs, scratch):
        match = self.regex.fullmatch
        outs[0].reshape(-1)[:] = [match(s) is not None for s in x.reshape(-1)]


# TfIdfVectorizer

MODES = ("TF", "IDF", "TFIDF")


@register("TfIdfVectorizer", since=9)
class TfIdfVectorizer(Kernel):
    """Counts the pool's n-grams in each row of X ([C] or [B, C]) into the output columns
    `ngram_indexes` names.

    The pool holds the 1-grams, then the 2-grams, ... (`ngram_counts[n-1]` is where the n-grams
    start); the j-th n-gram of the pool counts into column `ngram_indexes[j]` (a pool that repeats
    an n-gram is refused, as onnxruntime does). Of lengths n in
    [min_gram_length, max_gram_length], n items taken every `skip + 1` positions form an n-gram,
    for each skip in [0, max_skip_count]; 1-grams are counted once, whatever the skip. TF gives
    the counts, IDF the weight where the count is not zero, TFIDF weight times count. The j-th
    weight is the j-th n-gram's, as the spec says and onnxruntime does (onnx's reference
    evaluator reads it as column j's instead); without weights, IDF gives 1 and TFIDF the count.
    """

    attributes = {"max_gram_length": REQUIRED, "min_gram_length": REQUIRED, "max_skip_count": REQUIRED,
                  "mode": REQUIRED, "ngram_counts": REQUIRED, "ngram_indexes": REQUIRED,
                  "pool_int64s": None, "pool_strings": None, "weights": None}

    def decode(self):
        if self.mode not in MODES:
            self.fail(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if (self.pool_int64s is None) == (self.pool_strings is None):
            self.fail("exactly one of pool_int64s and pool_strings must be given")
        if not 1 <= self.min_gram_length <= self.max_gram_length:
            self.fail(f"gram lengths [{self.min_gram_length}, {self.max_gram_length}] are not a range from 1")
        if self.max_skip_count < 0:
            self.fail(f"max_skip_count must not be negative, got {self.max_skip_count}")
        pool = list(self.pool_int64s if self.pool_int64s is not None else self.pool_strings)
        starts = list(self.ngram_counts) + [len(pool)]
        if any(not 0 <= a <= b <= len(pool) for a, b in zip(starts, starts[1:])):
            self.fail(f"ngram_counts {list(self.ngram_counts)} are not ascending starts in a pool of {len(pool)}")
        self.columns = {}  # n-gram (a tuple) -> the output column it counts into (None: a length not counted)
        j = 0
        for n, (start, end) in enumerate(zip(starts, starts[1:]), 1):
            if (end - start) % n:
                self.fail(f"the pool's {n}-grams take {end - start} items, not a multiple of {n}")
            for k in range(start, end, n):
                if j >= len(self.ngram_indexes):
                    self.fail(f"ngram_indexes has {len(self.ngram_indexes)} entries, fewer than the pool's n-grams")
                gram = tuple(pool[k:k + n])
                if gram in self.columns:
                    self.fail(f"the pool repeats the {n}-gram {list(gram)}")
                counted = self.min_gram_length <= n <= self.max_gram_length
                self.columns[gram] = int(self.ngram_indexes[j]) if counted else None
                j += 1
        self.width = max((int(i) for i in self.ngram_indexes), default=-1) + 1
        if any(i < 0 for i in self.ngram_indexes):
            self.fail("ngram_indexes must not be negative")
        self.column_weights = None
        if self.weights is not None:
            if len(self.weights) < j:
                self.fail(f"weights has {len(self.weights)} entries for the pool's {j} n-grams")
            self.column_weights = np.zeros(self.width, dtype=np.float32)
            self.column_weights[np.asarray(self.ngram_indexes[:j], dtype=np.int64)] = self.weights[:j]
        self.strings = self.pool_strings is not None

    def infer(self, x):
        if self.strings != (x.dtype == STRING) or (not self.strings and x.dtype.kind not in "iu"):
            self.fail(f"X has type {x.dtype}; the pool holds {'strings' if self.strings else 'integers'}")
        if len(x.shape) > 2 or (len(x.shape) == 2 and x.shape[0] < 1):
            self.fail(f"X has shape {list(x.shape)}; expected [C] or [B, C] with B > 0")
        shape = (x.shape[0], self.width) if len(x.shape) == 2 else (self.width,)
        return [TensorInfo(shape, np.dtype(np.float32))]

    def run(self, x, outs, scratch):
        rows = x if x.ndim == 2 else x.reshape(1, -1)
        counts = np.zeros((rows.shape[0], self.width), dtype=np.int64)
        for r, row in enumerate(rows.tolist()):
            for n in range(self.min_gram_length, self.max_gram_length + 1):
                for skip in range(self.max_skip_count + 1 if n > 1 else 1):
                    step = skip + 1
                    for i in range(len(row) - (n - 1) * step):
                        column = self.columns.get(tuple(row[i:i + (n - 1) * step + 1:step]))
                        if column is not None:
                            counts[r, column] += 1
        out = outs[0].reshape(counts.shape)
        weights = self.column_weights
        if self.mode == "TF":
            out[...] = counts
        elif self.mode == "IDF":
            out[...] = (counts > 0) * (weights if weights is not None else np.float32(1))
        else:
            out[...] = counts * weights if weights is not None else counts
