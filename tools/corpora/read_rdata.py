#!/usr/bin/env python3
"""Reads character vectors out of an R lazy-load database (NAME.rdb + NAME.rdx) without R.

R keeps a package's data sets (data/Rdata.rdb/.rdx) and internal objects (R/sysdata.rdb/.rdx) as a
lazy-load database: the .rdx is a serialized, gzip- or zlib-compressed list whose `variables` element maps
each object's name to an (offset, length) pair in the .rdb; each .rdb record is a 4-byte big-endian
uncompressed length, for compression types 2 and 3 a one-byte type ('Z' zlib, '2' bzip2, 'X' xz, '0' none),
then the compressed serialization of the object.

The serialization format (R Internals, "Serialization formats"): "X\\n" for XDR (big-endian), the format
version (2 or 3), the writer's and the minimal reader's R versions, and for version 3 the native encoding;
then each object as a 32-bit flags word (type in the low byte; bit 8 object, bit 9 has attributes, bit 10
has a tag; the CHARSXP encoding levels above bit 12) followed by its contents. This reader decodes the
types data sets use: NULL, symbols, pairlists, character, logical, integer, double, complex and raw
vectors, lists, references to earlier symbols and environments, and ALTREP wrappers (compact sequences,
wrapped and deferred strings), which is enough for the character vectors of janeaustenr.

Usage:
  read_rdata.py DB_PREFIX --list                 # names and types of the objects
  read_rdata.py DB_PREFIX NAME [NAME...] [-o FILE] # the character vectors, one element a line (NA -> "")
DB_PREFIX is the path without .rdb/.rdx (e.g. .../janeaustenr/data/Rdata).
Standard library only.
"""
import argparse
import bz2
import lzma
import struct
import sys
import zlib

NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP, DOTSXP = 9, 10, 13, 14, 15, 16, 17
VECSXP, EXPRSXP, BCODESXP, EXTPTRSXP, WEAKREFSXP, RAWSXP, S4SXP = 19, 20, 21, 22, 23, 24, 25
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP = 255, 254, 253, 252, 251
BASENAMESPACE_SXP, NAMESPACESXP, PACKAGESXP, PERSISTSXP = 247, 249, 250, 248
EMPTYENV_SXP, BASEENV_SXP, ATTRLANGSXP, ATTRLISTSXP, ALTREP_SXP = 242, 241, 240, 239, 238

NA_INTEGER = -(2 ** 31)


class RObject:
    """A decoded R value: its SEXP type, its payload and its attributes (a dict name -> value)."""

    def __init__(self, sexptype, value, attributes=None):
        self.type = sexptype
        self.value = value
        self.attributes = attributes or {}

    def __repr__(self):
        return f"RObject(type={self.type}, value={self.value!r:.60})"


class Symbol(str):
    """An R symbol (a name), distinct from a character string."""


class Environment:
    """An environment; only its identity matters here (references point back to it)."""

    def __init__(self):
        self.frame = None
        self.enclosure = None


class Unserializer:
    def __init__(self, data, origin):
        self.data = data
        self.pos = 0
        self.origin = origin
        self.refs = []

    def fail(self, message):
        raise ValueError(f"{self.origin}: offset {self.pos}: {message}")

    def take(self, n):
        if self.pos + n > len(self.data):
            self.fail(f"truncated: need {n} bytes")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int(self):
        return struct.unpack(">i", self.take(4))[0]

    def length(self):
        n = self.int()
        if n == -1:  # a long vector: two more words
            hi, lo = struct.unpack(">II", self.take(8))
            return (hi << 32) | lo
        if n < 0:
            self.fail(f"negative length {n}")
        return n

    def header(self):
        fmt = self.take(2)
        if fmt != b"X\n":
            self.fail(f"not an XDR serialization (format {fmt!r}); ascii and native formats are not supported")
        version = self.int()
        if version not in (2, 3):
            self.fail(f"unsupported serialization version {version}")
        self.int()  # writer's R version
        self.int()  # minimal R version to read it
        if version == 3:
            self.take(self.int())  # native encoding, e.g. "UTF-8"

    def charsxp(self, flags):
        n = self.int()
        if n == -1:
            return None  # NA_character_
        raw = self.take(n)
        levels = flags >> 12
        if levels & (1 << 2):  # LATIN1_MASK
            return raw.decode("latin-1")
        return raw.decode("utf-8", errors="replace")  # UTF8, ASCII or native (UTF-8 here)

    def attributes_of(self, flags):
        if not flags & (1 << 9):
            return {}
        pairlist = self.item()
        return pairlist_to_dict(pairlist)

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        if t == NILVALUE_SXP:
            return None
        if t in (EMPTYENV_SXP, BASEENV_SXP, GLOBALENV_SXP, BASENAMESPACE_SXP):
            return RObject(ENVSXP, t)
        if t in (UNBOUNDVALUE_SXP, MISSINGARG_SXP):
            return RObject(t, None)
        if t == REFSXP:
            index = flags >> 8
            if index == 0:
                index = self.int()
            if not 1 <= index <= len(self.refs):
                self.fail(f"reference {index} to an object not read yet")
            return self.refs[index - 1]
        if t == PERSISTSXP:
            names = self.item()
            obj = RObject(PERSISTSXP, names)
            self.refs.append(obj)
            return obj
        if t == SYMSXP:
            name = self.item()  # a CHARSXP (decoded to str)
            sym = Symbol(name if isinstance(name, str) else "")
            self.refs.append(sym)
            return sym
        if t in (PACKAGESXP, NAMESPACESXP):
            obj = RObject(t, None)
            self.refs.append(obj)
            if self.int() != 0:  # OutStringVec: a 0, the length, then each string as an item
                self.fail("a namespace or package without its name vector")
            n = self.length()
            obj.value = [self.item() for _ in range(n)]
            return obj
        if t == ENVSXP:
            env = Environment()
            self.refs.append(env)
            self.int()  # locked
            env.enclosure = self.item()
            env.frame = self.item()
            self.item()  # hash table
            self.item()  # attributes
            return env
        if t in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLANGSXP, ATTRLISTSXP):
            # A pairlist written iteratively: attributes, tag, CAR, then the CDR as the next item.
            cells = []
            while True:
                attrs = self.attributes_of(flags) if has_attr else {}
                tag = self.item() if has_tag else None
                car = self.item()
                cells.append((tag, car, attrs))
                flags = self.int()
                t = flags & 0xFF
                has_attr = bool(flags & (1 << 9))
                has_tag = bool(flags & (1 << 10))
                if t not in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLANGSXP, ATTRLISTSXP):
                    self.pos -= 4
                    tail = self.item()
                    if tail is not None:
                        cells.append((None, tail, {}))
                    break
            return RObject(LISTSXP, cells)
        if t == CHARSXP:
            return self.charsxp(flags)
        if t in (LGLSXP, INTSXP):
            n = self.length()
            values = list(struct.unpack(f">{n}i", self.take(4 * n)))
            values = [None if v == NA_INTEGER else v for v in values]
            return RObject(t, values, self.attributes_of(flags))
        if t == REALSXP:
            n = self.length()
            return RObject(t, list(struct.unpack(f">{n}d", self.take(8 * n))), self.attributes_of(flags))
        if t == CPLXSXP:
            n = self.length()
            v = struct.unpack(f">{2 * n}d", self.take(16 * n))
            return RObject(t, [complex(v[2 * i], v[2 * i + 1]) for i in range(n)], self.attributes_of(flags))
        if t == RAWSXP:
            n = self.length()
            return RObject(t, self.take(n), self.attributes_of(flags))
        if t == STRSXP:
            n = self.length()
            values = []
            for _ in range(n):
                values.append(self.charsxp(self.int()))
            return RObject(t, values, self.attributes_of(flags))
        if t in (VECSXP, EXPRSXP):
            n = self.length()
            values = [self.item() for _ in range(n)]
            return RObject(t, values, self.attributes_of(flags))
        if t == S4SXP:
            return RObject(t, None, self.attributes_of(flags))
        if t == ALTREP_SXP:
            return self.altrep()
        self.fail(f"unsupported SEXP type {t}")

    def altrep(self):
        info = self.item()  # pairlist (class symbol, package symbol, type)
        state = self.item()
        attr = self.item()
        cells = info.value if isinstance(info, RObject) else []
        cls = str(cells[0][1]) if cells else "?"
        attributes = pairlist_to_dict(attr)
        if cls == "compact_intseq":  # state: REALSXP (n, first, step)
            n, first, step = state.value
            return RObject(INTSXP, [int(first + i * step) for i in range(int(n))], attributes)
        if cls == "compact_realseq":
            n, first, step = state.value
            return RObject(REALSXP, [first + i * step for i in range(int(n))], attributes)
        if cls in ("wrap_string", "wrap_integer", "wrap_real", "wrap_logical", "wrap_list", "wrap_raw",
                   "wrap_complex"):  # state: list(the wrapped vector, metadata)
            inner = state.value[0]
            return RObject(inner.type, inner.value, attributes or inner.attributes)
        if cls == "deferred_string":  # state: pairlist (the integer/real vector, scipen)
            arg = state.value[0][1]
            values = [None if v is None else format_number(v) for v in arg.value]
            return RObject(STRSXP, values, attributes)
        self.fail(f"unsupported ALTREP class {cls}")


def format_number(v):
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def pairlist_to_dict(pairlist):
    if not isinstance(pairlist, RObject) or pairlist.type != LISTSXP:
        return {}
    return {str(tag): value for tag, value, _ in pairlist.value if tag is not None}


def unserialize(data, origin):
    reader = Unserializer(data, origin)
    reader.header()
    return reader.item()


def decompress_record(record, origin):
    """One .rdb record: 4-byte big-endian length, optionally a type byte, then the compressed bytes."""
    if len(record) < 5:
        raise ValueError(f"{origin}: record too short")
    expected = struct.unpack(">I", record[:4])[0]
    kind, body = record[4:5], record[5:]
    if kind == b"Z":
        out = zlib.decompress(body)
    elif kind == b"2":
        out = bz2.decompress(body)
    elif kind == b"X":
        out = lzma.decompress(body)
    elif kind == b"0":
        out = body
    else:  # compression type 1: plain zlib right after the length
        out = zlib.decompress(record[4:])
    if len(out) != expected:
        raise ValueError(f"{origin}: record decompressed to {len(out)} bytes, header says {expected}")
    return out


class LazyLoadDB:
    def __init__(self, prefix):
        self.prefix = prefix
        with open(prefix + ".rdx", "rb") as f:
            index_bytes = f.read()
        # The index is gzip (saveRDS) or a 4-byte length + zlib stream.
        try:
            index_data = zlib.decompress(index_bytes, 47)
        except zlib.error:
            index_data = decompress_record(index_bytes, prefix + ".rdx")
        index = unserialize(index_data, prefix + ".rdx")
        names = index.attributes.get("names").value
        entries = dict(zip(names, index.value))
        self.variables = {}
        variables = entries["variables"]
        for name, pos in zip(variables.attributes["names"].value, variables.value):
            offset, length = pos.value
            self.variables[name] = (int(offset), int(length))
        with open(prefix + ".rdb", "rb") as f:
            self.rdb = f.read()

    def get(self, name):
        if name not in self.variables:
            raise KeyError(f"{self.prefix}.rdb has no object '{name}' (has {', '.join(sorted(self.variables))})")
        offset, length = self.variables[name]
        if offset + length > len(self.rdb):
            raise ValueError(f"{self.prefix}.rdb: object '{name}' lies outside the file")
        data = decompress_record(self.rdb[offset:offset + length], f"{self.prefix}.rdb[{name}]")
        return unserialize(data, f"{self.prefix}.rdb[{name}]")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("db", help="path of the database without .rdb/.rdx")
    parser.add_argument("names", nargs="*", help="character vectors to print, one element a line")
    parser.add_argument("--list", action="store_true", help="list the objects and their types")
    parser.add_argument("-o", "--output", help="write here instead of stdout")
    args = parser.parse_args()
    db = LazyLoadDB(args.db)
    if args.list or not args.names:
        for name in sorted(db.variables):
            try:
                obj = db.get(name)
            except ValueError as e:  # functions may hold byte code, which this reader does not decode
                print(f"{name}\t(not decoded: {e})")
                continue
            kind = obj.type if isinstance(obj, RObject) else type(obj).__name__
            size = len(obj.value) if isinstance(obj, RObject) and isinstance(obj.value, (list, bytes)) else 0
            print(f"{name}\ttype {kind}\tlength {size}")
        return 0
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        for name in args.names:
            obj = db.get(name)
            if not isinstance(obj, RObject) or obj.type != STRSXP:
                raise ValueError(f"'{name}' is not a character vector")
            for line in obj.value:
                out.write(("" if line is None else line) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
