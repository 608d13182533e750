"""What a device event is: its overlap class, its activity, its precision, a short name.

    >>> overlap_class("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, ...)", "kernel")
    'communication'
    >>> activity("Memcpy HtoD (Pageable -> Device)", "memcpy")
    'memcpy_htod'
    >>> precision("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn")
    'fp16'
    >>> precision("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw")
    'tf32'
    >>> precision("void at::native::vectorized_elementwise_kernel<4, at::native::"
    ...           "CUDAFunctor_add<c10::Half>, at::detail::Array<char*, 3> >(int, ...)")
    'fp16'
    >>> short_name("void at::native::vectorized_elementwise_kernel<4, at::native::"
    ...            "CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, ...)")
    'vectorized_elementwise_kernel'

Precision is read from the kernel name only; the heuristics, first match wins:

1. library tags naming the math type: `fp8`/`e4m3`/`e5m2` -> fp8; `bf16`/`bfloat16`
   (and ROCm Tensile's `_BBS_`/`_BB_`) -> bf16; `fp16`/`f16`/`half`, cuBLAS' `h884`,
   `h1688`, `h16816`, `hgemm`, Tensile's `_HHS_`/`_HH_` -> fp16; `int8`/`i8`/`imma`,
   `i8816`, `s8` -> int8; `tf32`, or Ampere tensor-core single-precision tiles
   `s1688`/`s16816` (which run TF32) -> tf32; `dgemm`/`fp64`/`f64`/`double`, Tensile `_DD`
   -> fp64; `sgemm`, `scudnn`, `gcgemm`, `fp32`/`f32`, Tensile `_SB_`/`_SS_` -> fp32;
   These tags are looked for in the bare name and the first template argument only
   (`cutlass::Kernel<cutlass_80_tensorop_s1688gemm_...>`), never deeper in the template;
2. otherwise the first floating-point element type among the kernel's template arguments:
   `c10::Half`, `c10::BFloat16`, `c10::Float8_*`, `double`, `float`; else an integer type
   (`long`, `int`, `bool`, `unsigned char` ... -> int);
3. otherwise `unknown` (for example an undemangled name with no tag).

Collectives take their data type from their name's suffix (`_Sum_float`, `_Sum_int8_t`).
"""

from __future__ import annotations

import re

OVERLAP_CLASSES = ("compute", "communication", "memory")
COLLECTIVE = re.compile(r"^(void\s+)?(nccl|rccl)\w*kernel", re.IGNORECASE)
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int", "unknown")
_TAGS = [
    ("fp8", re.compile(r"fp8|e4m3|e5m2|float8", re.IGNORECASE)),
    ("bf16", re.compile(r"bf16|bfloat16|_BBS_|_BB_", re.IGNORECASE)),
    (
        "fp16",
        re.compile(r"fp16|(?<![bt])f16|half|h884|h1688|h16816|hgemm|_HHS_|_HH_", re.IGNORECASE),
    ),
    ("int8", re.compile(r"int8|(?<![a-z])i8|imma|i8816|(?<![a-z])s8(?![0-9])", re.IGNORECASE)),
    ("tf32", re.compile(r"tf32|s1688|s16816", re.IGNORECASE)),
    ("fp64", re.compile(r"dgemm|fp64|(?<![a-z])f64|double|_DD", re.IGNORECASE)),
    ("fp32", re.compile(r"sgemm|scudnn|gcgemm|fp32|(?<![a-z])f32|_SB_|_SS_", re.IGNORECASE)),
]
_TEMPLATE_TYPES = [
    ("fp8", re.compile(r"c10::Float8_")),
    ("bf16", re.compile(r"c10::BFloat16")),
    ("fp16", re.compile(r"c10::Half|\b__half\b")),
    ("fp64", re.compile(r"\bdouble\b")),
    ("fp32", re.compile(r"\bfloat\b")),
    ("int", re.compile(r"\b(long|int|short|bool|unsigned char|signed char|char)\b")),
]
_COLLECTIVE_TYPE = {
    "float": "fp32",
    "f32": "fp32",
    "half": "fp16",
    "f16": "fp16",
    "bf16": "bf16",
    "double": "fp64",
    "f64": "fp64",
    "int8_t": "int8",
    "i8": "int8",
    "uint8_t": "int8",
    "u8": "int8",
    "int32_t": "int",
    "uint32_t": "int",
    "int64_t": "int",
    "uint64_t": "int",
}
MATMUL = re.compile(
    r"gemm|xmma|cutlass|cublas|Cijk_|s1688|s16816|h884|h1688|h16816|i8816|scudnn|conv|"
    r"wgrad|dgrad|fprop",
    re.IGNORECASE,
)
SHORT_NAME_LIMIT = 60


def overlap_class(name: str, kind: str) -> str:
    """memory (memcpy, memset), communication (NCCL/RCCL collectives) or compute."""
    if kind != "kernel":
        return "memory"
    return "communication" if COLLECTIVE.match(name) else "compute"


def activity(name: str, kind: str) -> str:
    """kernel, collective, memcpy_<direction> (htod, dtoh, dtod, htoh, ptop, other), memset."""
    if kind == "memset":
        return "memset"
    if kind == "memcpy":
        m = re.match(r"Memcpy\s+(HtoD|DtoH|DtoD|HtoH|PtoP)", name, re.IGNORECASE)
        return f"memcpy_{m.group(1).lower()}" if m else "memcpy_other"
    return "collective" if COLLECTIVE.match(name) else "kernel"


def is_pageable(name: str) -> bool:
    """A host copy through pageable (not pinned) memory: `Memcpy HtoD (Pageable -> Device)`."""
    return "pageable" in name.lower()


def is_matmul(name: str) -> bool:
    """GEMM and convolution kernels: the ones tensor cores speed up."""
    return bool(MATMUL.search(name))


def _parts(name: str) -> tuple[str, str]:
    """(name without its call arguments, its outermost template arguments)."""
    depth, last_call, template, open_at = 0, len(name), "", -1
    for i, ch in enumerate(name):
        if ch in "<(":
            if depth == 0:
                open_at = i
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
            if depth == 0:
                if ch == ")":
                    last_call = open_at
                elif not template:
                    template = name[open_at : i + 1]
    head = name[:last_call] if last_call < len(name) and name.rstrip().endswith(")") else name
    return head, template


def _bare(head: str) -> str:
    depth, bare = 0, []
    for ch in head:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            bare.append(ch)
    return "".join(bare).strip()


def precision(name: str) -> str:
    head, template = _parts(name.strip())
    if COLLECTIVE.match(name):
        lowered = _bare(head).lower()
        for suffix, label in _COLLECTIVE_TYPE.items():
            if lowered.endswith("_" + suffix):
                return label
        return "unknown"
    tagged = _bare(head) + " " + template[1:-1].split(",", 1)[0]
    for label, pattern in _TAGS:
        if pattern.search(tagged):
            return label
    found = [(m.start(), label) for label, p in _TEMPLATE_TYPES if (m := p.search(template))]
    floating = [f for f in found if f[1] != "int"]
    return min(floating or found)[1] if found else "unknown"


def short_name(name: str, limit: int = SHORT_NAME_LIMIT) -> str:
    """The kernel's bare function name: no `void`, template or call arguments, namespaces
    (generic names such as `Kernel` keep their first template argument)."""
    head, template = _parts(name.strip())
    if head.startswith("void "):
        head = head[5:]
    text = _bare(head).rsplit("::", 1)[-1] or name.strip()
    if len(text) < 12 and template:
        text += "<" + template[1:-1].split(",", 1)[0].strip() + ">"
    if len(text) > limit:
        text = text[: limit - 1] + "~"
    return text
