"""capturekit.py - what the capture_*.py scripts share: a free loopback port, and the pump
that copies one direction of a relayed connection to its peer and to a file."""

import socket


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pump(src, dst, path):
    """Copies src to dst until src ends, appending every byte to the file at path; then ends
    dst's write side, as the peer did."""
    with open(path, "ab") as out:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            out.write(data)
            out.flush()
            try:
                dst.sendall(data)
            except OSError:
                break
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
