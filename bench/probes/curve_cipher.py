"""How fast one core runs CURVE's cipher: XSalsa20-Poly1305 (libsodium's secretbox, which
libzmq's CURVE uses for every message after the handshake) over 64 MiB in parts of the
zmq connector's sizes: the bound of a CURVE-encrypted zmq payload, which is encrypted on
the producer's one I/O thread and decrypted on the consumer's.

    pip install pynacl   # libsodium's Python binding; not a dependency of omni
    OMP_NUM_THREADS=1 python bench/probes/curve_cipher.py
"""

from __future__ import annotations

import os
import statistics
import time

TOTAL = 64 * 1024 * 1024


def main() -> None:
    import nacl.secret
    import nacl.utils

    box = nacl.secret.SecretBox(nacl.utils.random(32))
    for part in (256 * 1024, 1024 * 1024):
        data, count = os.urandom(part), TOTAL // part
        sealed, opened = [], []
        for _ in range(7):
            start = time.perf_counter()
            boxes = [box.encrypt(data, nacl.utils.random(24)) for _ in range(count)]
            sealed.append(time.perf_counter() - start)
            start = time.perf_counter()
            for message in boxes:
                box.decrypt(message)
            opened.append(time.perf_counter() - start)
        seal, unseal = statistics.median(sealed), statistics.median(opened)
        print(f"[curve_cipher] 64 MiB in {part // 1024} KiB parts: encrypt {seal * 1e3:.1f} ms "
              f"({TOTAL / seal / 1e6:.0f} MB/s), decrypt {unseal * 1e3:.1f} ms "
              f"({TOTAL / unseal / 1e6:.0f} MB/s), one core, median of 7", flush=True)


if __name__ == "__main__":
    main()
