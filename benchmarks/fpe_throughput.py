"""Values per second for the `fpe` method (FF3-1) beside the keyed HMAC pseudonym, on one core.

Run: .venv/bin/python benchmarks/fpe_throughput.py [--values N] [--repeat R] [--json]
Distinct MRN-shaped values (so neither function's cache helps), in three shapes: 8 digits, `12-3456-7890`
(separators), and a 16-digit number with a Luhn check digit. Each figure is the best of R runs, and the
ratio is HMAC values/s over FPE values/s. Also the FF3-1 core alone (digits only, no shape handling) and
the cached rate (the same value again, as in a bundle that repeats an MRN).
"""
from __future__ import annotations

import argparse
import json
import random
import time

from fhir_transforms.fpe import FF31, FpeFormat, derive_key, tweak_for
from fhir_transforms.keys import Key
from fhir_transforms.pseudonym import Pseudonymizer

SYSTEM = "urn:oid:2.16.840.1.113883.19.5"


def values(n: int, shape: str, rng: random.Random) -> list[str]:
    if shape == "8 digits":
        return [f"{rng.randrange(10 ** 8):08d}" for _ in range(n)]
    if shape == "separators 12-3456-7890":
        return [f"{rng.randrange(100):02d}-{rng.randrange(10 ** 4):04d}-{rng.randrange(10 ** 4):04d}" for _ in range(n)]
    return [f"{rng.randrange(10 ** 16):016d}" for _ in range(n)]


def rate(fn, items: list[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for v in items:
            fn(v)
        best = min(best, time.perf_counter() - start)
    return len(items) / best


def fresh_fpe(key: Key, fmt: FpeFormat):
    """`fpe` through a new Pseudonymizer: its caches start empty, so every value is computed."""
    pseudo = Pseudonymizer(key)
    return lambda v: pseudo.identifier_fpe(SYSTEM, v, fmt)


def fresh_hmac(key: Key):
    pseudo = Pseudonymizer(key)
    return lambda v: pseudo.identifier(SYSTEM, v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--values", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(7)
    key = Key("k-bench", bytes(range(32)))
    rows = []
    for shape, fmt in (("8 digits", FpeFormat()), ("separators 12-3456-7890", FpeFormat()),
                       ("16 digits with Luhn check digit", FpeFormat(check_digit="luhn"))):
        items = values(args.values, shape, rng)
        fpe = max(rate(fresh_fpe(key, fmt), items, 1) for _ in range(args.repeat))
        hmac = max(rate(fresh_hmac(key), items, 1) for _ in range(args.repeat))
        rows.append({"shape": shape, "fpe_values_per_s": round(fpe), "hmac_values_per_s": round(hmac),
                     "hmac_over_fpe": round(hmac / fpe, 1)})
    core = FF31(derive_key(key.secret), "0123456789")
    tweak = tweak_for("identifier|" + SYSTEM)
    items = values(args.values, "8 digits", rng)
    core_rate = rate(lambda v: core.encrypt(v, tweak), items, args.repeat)
    warm = Pseudonymizer(key)
    cached_rate = rate(lambda v: warm.identifier_fpe(SYSTEM, v, FpeFormat()), items[:1000] * 20, args.repeat)
    summary = {"values": args.values, "repeat": args.repeat, "shapes": rows,
               "ff3_1_core_8_digits_per_s": round(core_rate), "fpe_cached_per_s": round(cached_rate)}
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{'shape':34} {'fpe values/s':>14} {'hmac values/s':>14} {'hmac/fpe':>9}")
    for r in rows:
        print(f"{r['shape']:34} {r['fpe_values_per_s']:>14,} {r['hmac_values_per_s']:>14,} {r['hmac_over_fpe']:>9}")
    print(f"FF3-1 core alone, 8 digits: {round(core_rate):,} values/s; fpe of a repeated value (cached): "
          f"{round(cached_rate):,} values/s")


if __name__ == "__main__":
    main()
