"""free_port: a port below the ephemeral range, free when drawn; bind(0) only where no such range is left."""

import socket

from hypothesis import given, settings, strategies as st

from reshardctl.launch.ports import EPHEMERAL_DEFAULT, LOWEST, ephemeral_range, free_port


def _range_file(tmp_path, text: str) -> str:
    p = tmp_path / "ip_local_port_range"
    p.write_text(text)
    return str(p)


def test_the_port_is_outside_the_ephemeral_range_and_binds(tmp_path):
    lo, hi = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert not lo <= port <= hi and port >= LOWEST
        with socket.socket() as s:  # free: this process can listen on it
            s.bind(("127.0.0.1", port))
            s.listen()


def test_a_port_in_use_is_never_given(tmp_path):
    # the span squeezed to [5000, 5999] (below the ports the rest of the suite draws from, so holding it
    # takes nothing from a parallel test) with its first 999 ports held: only the last may be given
    low = 5000
    path = _range_file(tmp_path, f"{low + 1000}\t65535\n")
    held = []
    try:
        for port in range(low, low + 999):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
            except OSError:  # some service's already: free_port's bind fails on it just the same
                s.close()
                continue
            held.append(s)
        got = {free_port(range_file=path, lowest=low) for _ in range(5)}
        mine = {s.getsockname()[1] for s in held}
    finally:
        for s in held:
            s.close()
    # each draw found the one port left or fell back to the OS's pick: never a port held
    assert len(mine) > 900 and not got & mine, (len(mine), got & mine)
    assert all(p == low + 999 or p >= low + 1000 for p in got), got


def test_without_room_below_or_above_the_os_picks(tmp_path):
    path = _range_file(tmp_path, "9000\t65000\n")  # a DGX-style range: 9000-65000
    lo, hi = ephemeral_range(path)
    assert (lo, hi) == (9000, 65000)
    assert all(lo <= free_port(range_file=path) <= hi for _ in range(5))  # bind(0): from the kernel's range


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=20))
def test_an_unreadable_range_file_reads_as_linuxs_default(tmp_path_factory, text):
    path = _range_file(tmp_path_factory.mktemp("r"), text)
    lo, hi = ephemeral_range(path)
    parts = text.split()
    try:
        want = (int(parts[0]), int(parts[1]))
        ok = 0 < want[0] <= want[1] <= 65535
    except (IndexError, ValueError):
        ok = False
    assert (lo, hi) == (want if ok else EPHEMERAL_DEFAULT)
    assert ephemeral_range(str(tmp_path_factory.getbasetemp() / "no-such-file")) == EPHEMERAL_DEFAULT
