"""The ring handshake's MAC (ring_hs_hmac in collective/ring_handshake.c: HMAC-SHA256 from
libcrypto) against the test vectors of RFC 4231 and against Python's hmac on random keys and
messages, over messages given in parts as the handshake gives them; built under ASan/UBSan
(tests/shim_progs/hmac_vectors.c)."""
from __future__ import annotations

import hashlib
import hmac
import subprocess
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# RFC 4231, section 4: (key, data, HMAC-SHA-256); test case 5 gives the output truncated to 128 bits.
RFC4231 = [
    (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 20, b"\xdd" * 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (bytes(range(1, 26)), b"\xcd" * 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    (b"\x0c" * 20, b"Test With Truncation", "a3b6167473100ee06e0c796c2955552b"),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    (b"\xaa" * 131, b"This is a test using a larger than block-size key and a larger than block-size data. The key "
     b"needs to be hashed before being used by the HMAC algorithm.",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
]


@pytest.fixture(scope="module")
def hmac_vectors(tmp_path_factory):
    exe = tmp_path_factory.mktemp("hmac") / "hmac_vectors"
    subprocess.run(["gcc", "-O1", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", *(f"-I{ROOT / d}" for d in ("collective", "codecs_c", "inceptionn")),
                    str(TESTS / "shim_progs" / "hmac_vectors.c"), str(ROOT / "collective" / "ring_handshake.c"),
                    "-lcrypto", "-o", str(exe)], check=True)

    def run(pairs: list[tuple[bytes, bytes]]) -> list[str]:
        lines = "".join(f"{key.hex()} {msg.hex() or '-'}\n" for key, msg in pairs)
        r = subprocess.run([exe], input=lines, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()
    return run


def test_rfc4231_vectors(hmac_vectors):
    got = hmac_vectors([(key, data) for key, data, _ in RFC4231])
    assert len(got) == len(RFC4231)
    for n, (g, (_, _, want)) in enumerate(zip(got, RFC4231), start=1):
        assert g[:len(want)] == want, f"RFC 4231 test case {n}"


def test_matches_python_hmac_on_random_keys_and_messages(hmac_vectors):
    rng = np.random.default_rng(28)
    pairs = [(rng.bytes(kl), rng.bytes(n)) for n in (0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000, 4097)
             for kl in (1, 16, 32, 63, 64, 65, 200)]
    assert hmac_vectors(pairs) == [hmac.new(key, msg, hashlib.sha256).hexdigest() for key, msg in pairs]
