"""Kernel names for display: a C++ kernel's base name, as Nsight Systems' shortName, Perfetto and HTA show it.

`short_kernel_name("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, ...>, false>(Flash_fwd_params)")`
is `flash_fwd_kernel`: no return type, namespaces, template arguments or parameters. Itanium-mangled
names (`_ZN5aiter24add_rmsnorm_quant_kernelI...`, as ROCm traces hold some) give their base name too;
a generic entry point (`ck_tile::kentry<1, Rmsnorm2dFwd<...>>`, `cutlass::Kernel2<...>`) is named by the
kernel it wraps; a Tensile GEMM (`Cijk_...`) keeps its problem type and tile sizes. Other names stay as
they are, cut in the middle past MAX_CHARS. The result is its own short name (shortening is idempotent).
"""
from __future__ import annotations

import re

MAX_CHARS = 60
# Entry points whose own name says nothing: the kernel they run is their first template argument (and
# CUTLASS's architecture guards, enable_sm90_or_later<Kernel> and the like).
WRAPPERS = frozenset({"kentry", "Kernel", "Kernel2", "device_kernel", "kernel"})
_GUARD = re.compile(r"^enable_sm\d+")
_BUILTIN_TYPES = frozenset({"bool", "char", "short", "int", "long", "float", "double", "half", "unsigned", "signed",
                            "void", "__half", "__nv_bfloat16", "__hip_bfloat16"})
_OPEN, _CLOSE = "<({[", ">)}]"
_TENSILE_KEPT = re.compile(r"^(MT|MI)\d")


def short_kernel_name(name: str) -> str:
    """The name to show for a GPU kernel (or any GPU operation's name, which comes back as it is when it is no
    C++ signature), at most MAX_CHARS characters."""
    if name.startswith("_Z"):
        short = _mangled_base(name)
    elif name.startswith("Cijk_"):
        fields = name.split("_")
        short = "_".join(fields[:4] + [f for f in fields[4:] if _TENSILE_KEPT.match(f)])
    else:
        short = _demangled_base(name)
    return _cut(short or name)


def _cut(text: str) -> str:
    """`text` cut in the middle to MAX_CHARS (the end of a name often tells two kernels apart)."""
    if len(text) <= MAX_CHARS:
        return text
    tail = MAX_CHARS // 3
    return text[:MAX_CHARS - tail - 1] + "…" + text[-tail:]


def _demangled_base(name: str) -> str | None:
    """The base name of a demangled C++ signature; None for words that are none ('Memcpy DtoD (Device -> Device)')."""
    text = name.replace("(anonymous namespace)", "{anonymous}")
    params = _top_level(text, "(")
    head = text[:params] if params is not None else text
    if params is not None and (params == 0 or head[-1] == " "):
        return None  # a parenthesis after a space: words, not a signature
    spaces = [i for i in _top_level_all(head, " ")]
    if spaces:  # a return type (`void`, `std::enable_if<...>::type`) before the name
        head = head[spaces[-1] + 1:]
    if not head or _depth_error(head):
        return None
    parts = _split_scope(head)
    base, args = _strip_template(parts[-1])
    if base.startswith("{") and len(parts) > 1:  # a lambda: name it by its enclosing function
        parts = parts[:-1]
        base, args = _strip_template(parts[-1])
    if base in WRAPPERS or _GUARD.match(base):
        inner = _first_type_argument(args)
        if inner is not None:
            return _demangled_base(inner) or inner
        if len(parts) > 1:
            return f"{_strip_template(parts[-2])[0]}::{base}"
    return base


def _depth_error(text: str) -> bool:
    depth = 0
    for c in text:
        depth += (c in _OPEN) - (c in _CLOSE)
        if depth < 0:
            return True
    return depth != 0


def _top_level_all(text: str, char: str):
    """Indexes of `char` in `text` outside any brackets."""
    depth = 0
    for i, c in enumerate(text):
        if c == char and depth == 0:
            yield i
        depth += (c in _OPEN) - (c in _CLOSE)


def _top_level(text: str, char: str) -> int | None:
    return next(_top_level_all(text, char), None)


def _split_scope(name: str) -> list[str]:
    """`a::b<x::y>::c` as ['a', 'b<x::y>', 'c']."""
    parts, start, depth = [], 0, 0
    i = 0
    while i < len(name):
        c = name[i]
        if depth == 0 and name.startswith("::", i):
            parts.append(name[start:i])
            start = i = i + 2
            continue
        depth += (c in _OPEN) - (c in _CLOSE)
        i += 1
    parts.append(name[start:])
    return [p for p in parts if p]


def _strip_template(part: str) -> tuple[str, list[str]]:
    """`name<a, b<c>>` as ('name', ['a', 'b<c>'])."""
    lt = part.find("<")
    if lt <= 0 or not part.endswith(">"):
        return part, []
    inner = part[lt + 1:-1]
    cuts = [-1, *_top_level_all(inner, ","), len(inner)]
    return part[:lt], [inner[a + 1:b].strip() for a, b in zip(cuts, cuts[1:])]


def _first_type_argument(args: list[str]) -> str | None:
    """The first template argument that names a type of its own (no number, no builtin type)."""
    for arg in args:
        if not arg or arg[0].isdigit() or arg[0] in "-(" or arg in ("true", "false"):
            continue
        return None if arg.split("<")[0].split()[-1] in _BUILTIN_TYPES else arg
    return None


def _mangled_base(name: str) -> str | None:
    """The base name of an Itanium-mangled function name (`_ZN5aiter24add_rmsnorm_quant_kernelI...` is
    add_rmsnorm_quant_kernel); a wrapper's first template argument that is a class names it instead."""
    base, rest = _mangled_name(name[2:])
    if base in WRAPPERS and rest.startswith("I"):
        rest = rest[1:]
        while rest.startswith("L"):  # a literal argument, e.g. Li1E
            end = rest.find("E")
            rest = rest[end + 1:] if end > 0 else ""
        inner, _ = _mangled_name(rest)
        return inner or base
    return base


def _mangled_name(text: str) -> tuple[str | None, str]:
    """The last identifier of the (nested) name at the start of `text`, and what follows that identifier."""
    nested = text.startswith("N")
    i = 1 if nested else 0
    last = None
    while i < len(text):
        if text[i] in "rVKRO" and nested:  # qualifiers
            i += 1
        elif text.startswith("St", i):
            i += 2
        elif text[i] == "S":  # a substitution (S_, S0_, ...): an earlier prefix
            end = text.find("_", i)
            if end < 0:
                break
            i = end + 1
        elif text[i].isdigit():
            digits = re.match(r"\d+", text[i:]).group()
            start = i + len(digits)
            last = text[start:start + int(digits)]
            i = start + int(digits)
            if not nested:
                break
        else:
            break
    return last, text[i:]
