"""The text of each page of a PDF, read with the standard library only (no PDF package is pinned): enough of
the format for what Chromium's Skia backend writes (uncompressed object syntax, FlateDecode content streams,
Type0 fonts with a ToUnicode CMap, text shown by Tj and TJ). Used by the print test of the audit card."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

OBJ_START = re.compile(rb"(\d+) 0 obj\b")
REF = rb"(\d+) 0 R"


def _objects(data: bytes) -> dict[int, bytes]:
    """Object number → its body, read in file order; a stream is skipped by its /Length (its bytes may hold
    anything, "endobj" included)."""
    objs: dict[int, bytes] = {}
    pos = 0
    while (m := OBJ_START.search(data, pos)) is not None:
        start = m.end()
        s = data.find(b"stream", start)
        e = data.find(b"endobj", start)
        if 0 <= s < e:  # a stream object: its dictionary names its length (a number or a reference)
            length = re.search(rb"/Length\s+(\d+)(\s+0\s+R)?", data[start:s])
            n = int(length.group(1))
            if length.group(2):
                ref = re.search(rb"(?:^|\s)" + length.group(1) + rb" 0 obj\s*(\d+)", data)
                n = int(ref.group(1))
            body_start = s + len(b"stream") + (2 if data[s + 6:s + 8] == b"\r\n" else 1)
            e = data.find(b"endobj", body_start + n)
        objs[int(m.group(1))] = data[start:e]
        pos = e + len(b"endobj")
    return objs


def _stream(body: bytes) -> bytes:
    start = body.index(b"stream") + len(b"stream")
    start += 2 if body[start:start + 2] == b"\r\n" else 1
    raw = body[start:body.rindex(b"endstream")]  # the end-of-line before endstream stays: zlib ignores it
    return zlib.decompressobj().decompress(raw) if b"/FlateDecode" in body[:body.index(b"stream")] else raw


def _dict_entry(body: bytes, objs: dict[int, bytes], key: bytes) -> bytes:
    """The value of /key in a dictionary: an inline << … >> or the body of the object it refers to."""
    m = re.search(rb"/" + key + rb"\s*(" + REF + rb"|<<)", body)
    if m is None:
        return b""
    if m.group(2):
        return objs[int(m.group(2))]
    depth, i = 0, m.start(1)
    while True:  # the balanced << … >>
        if body[i:i + 2] == b"<<":
            depth, i = depth + 1, i + 2
        elif body[i:i + 2] == b">>":
            depth, i = depth - 1, i + 2
            if depth == 0:
                return body[m.start(1):i]
        else:
            i += 1


def _cmap(data: bytes) -> dict[bytes, str]:
    """Glyph code (hex, upper case) → text, from a ToUnicode CMap's bfchar and bfrange sections."""
    out: dict[bytes, str] = {}

    def text(h: bytes) -> str:
        return bytes.fromhex(h.decode()).decode("utf-16-be")

    for block in re.findall(rb"beginbfchar(.*?)endbfchar", data, re.S):
        for src, dst in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
            out[src.upper()] = text(dst)
    for block in re.findall(rb"beginbfrange(.*?)endbfrange", data, re.S):
        for lo, hi, dst in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
            width, first = len(lo), int(dst, 16)
            for k, code in enumerate(range(int(lo, 16), int(hi, 16) + 1)):
                out[f"{code:0{width}X}".encode()] = text(f"{first + k:0{len(dst)}X}".encode())
    return out


def _pages(objs: dict[int, bytes], node: int) -> list[int]:
    body = objs[node]
    if re.search(rb"/Type\s*/Page\b(?!s)", body):
        return [node]
    kids = re.search(rb"/Kids\s*\[(.*?)\]", body, re.S)
    return [p for k in re.findall(REF, kids.group(1)) for p in _pages(objs, int(k))]


def _show(content: bytes, fonts: dict[bytes, dict[bytes, str]]) -> str:
    out, font = [], {}
    for tok in re.finditer(rb"/([A-Za-z0-9_.+-]+)\s+[-\d.]+\s+Tf|\[(.*?)\]\s*TJ|<([0-9A-Fa-f]*)>\s*Tj", content, re.S):
        if tok.group(1) is not None:
            font = fonts.get(tok.group(1), {})
            continue
        hexes = re.findall(rb"<([0-9A-Fa-f]*)>", tok.group(2)) if tok.group(2) is not None else [tok.group(3)]
        for h in hexes:
            h = h.upper()
            width = len(next(iter(font))) if font else 4
            out.extend(font.get(h[i:i + width], "") for i in range(0, len(h), width))
        out.append(" ")
    return "".join(out)


def page_texts(path: Path) -> list[str]:
    """The text shown on each page, in page order (glyphs joined as drawn, a space after each text run)."""
    data = Path(path).read_bytes()
    objs = _objects(data)
    root = int(re.search(rb"/Root\s+" + REF, data[data.rindex(b"trailer"):]).group(1))
    pages_ref = int(re.search(rb"/Pages\s+" + REF, objs[root]).group(1))
    texts = []
    for page in _pages(objs, pages_ref):
        body = objs[page]
        font_dict = _dict_entry(_dict_entry(body, objs, b"Resources"), objs, b"Font")
        fonts = {}
        for name, ref in re.findall(rb"/([A-Za-z0-9_.+-]+)\s+" + REF, font_dict):
            uni = re.search(rb"/ToUnicode\s+" + REF, objs[int(ref)])
            fonts[name] = _cmap(_stream(objs[int(uni.group(1))])) if uni else {}
        contents = re.search(rb"/Contents\s*(\[.*?\]|" + REF + rb")", body, re.S).group(1)
        streams = b"\n".join(_stream(objs[int(r)]) for r in re.findall(REF, contents))
        texts.append(_show(streams, fonts))
    return texts
