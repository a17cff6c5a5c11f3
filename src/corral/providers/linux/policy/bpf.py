"""A tiny classic-BPF assembler: instructions with symbolic jump targets (pure).

Used by ``seccomp.py`` to build its filter. Each jump names a label; ``assemble``
resolves it to the 8-bit forward offset classic BPF has and refuses a jump out
of range or a program over ``BPF_MAXINSNS``, so a policy that outgrows local
jumps fails loudly when it is built. ``struct sock_filter`` is packed
little-endian (``<HBBI``), as on both arches corral supports.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

__all__ = ["AND_K", "JEQ_K", "JGE_K", "JSET_K", "LD_W_ABS", "MAX_INSNS", "RET_K", "Program"]

# opcodes (linux/filter.h)
LD_W_ABS: Final = 0x20   # BPF_LD | BPF_W | BPF_ABS
JEQ_K: Final = 0x15      # BPF_JMP | BPF_JEQ | BPF_K
JGE_K: Final = 0x35      # BPF_JMP | BPF_JGE | BPF_K
JSET_K: Final = 0x45     # BPF_JMP | BPF_JSET | BPF_K
AND_K: Final = 0x54      # BPF_ALU | BPF_AND | BPF_K
RET_K: Final = 0x06      # BPF_RET | BPF_K
MAX_INSNS: Final = 4096  # BPF_MAXINSNS


@dataclass(frozen=True, slots=True)
class _Insn:
    code: int
    k: int
    jt: str | None = None  # label names; None = next instruction
    jf: str | None = None


class Program:
    def __init__(self) -> None:
        self.insns: list[_Insn] = []
        self.labels: dict[str, int] = {}
        self._n = 0

    def label(self, name: str) -> None:
        self.labels[name] = len(self.insns)

    def fresh(self) -> str:
        self._n += 1
        return f"_L{self._n}"

    def load(self, offset: int) -> None:
        self.insns.append(_Insn(LD_W_ABS, offset))

    def jump(self, code: int, k: int, jt: str | None, jf: str | None = None) -> None:
        self.insns.append(_Insn(code, k, jt, jf))

    def and_(self, k: int) -> None:
        self.insns.append(_Insn(AND_K, k))

    def ret(self, k: int) -> None:
        self.insns.append(_Insn(RET_K, k))

    def assemble(self) -> bytes:
        if not 0 < len(self.insns) <= MAX_INSNS:
            raise ValueError(f"seccomp program has {len(self.insns)} instructions")
        out = bytearray()
        for pc, insn in enumerate(self.insns):
            jt = self._offset(pc, insn.jt)
            jf = self._offset(pc, insn.jf)
            out += struct.pack("<HBBI", insn.code, jt, jf, insn.k & 0xFFFFFFFF)
        return bytes(out)

    def _offset(self, pc: int, target: str | None) -> int:
        if target is None:
            return 0
        off = self.labels[target] - pc - 1
        if not 0 <= off <= 255:
            raise ValueError(f"jump from {pc} to {target} out of range ({off})")
        return off
