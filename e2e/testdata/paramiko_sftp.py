"""SFTP on a node through the tether bastion with Debian's paramiko.

Paramiko's connection plugin (Ansible), Fabric and Netmiko reach hosts this
way: a Transport to the jump host, a direct-tcpip channel to the node, a
second Transport over that channel, then SFTP. Paramiko 2.12 has no AES-GCM
and no chacha20-poly1305: it offers aes-ctr and aes-cbc only.

Host keys are pinned (paramiko does not check host certificates): the hub's
and the node's plain keys, in authorized_keys form, come from the test.
Prints one "ok: ..." line per check; exits non-zero at the first failure.
"""

import argparse
import base64
import hashlib
import io
import os
import stat
import sys

import paramiko


def connect(sock, host_key_line, user, key, what):
    t = paramiko.Transport(sock)
    t.start_client(timeout=30)
    want = base64.b64decode(host_key_line.split()[1])
    got = t.get_remote_server_key()
    if got.asbytes() != want:
        sys.exit(f"{what}: host key {got.get_name()} {got.get_base64()} is not the pinned one")
    t.auth_publickey(user, key)
    if not t.is_authenticated():
        sys.exit(f"{what}: public key authentication as {user} failed")
    print(f"ok: {what}: {t.remote_version}, cipher {t.remote_cipher}/{t.local_cipher}, mac {t.remote_mac}")
    return t


def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)
    print("ok: " + what)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hub", required=True, help="bastion HOST:PORT")
    p.add_argument("--hub-key", required=True, help="the bastion's host key, authorized_keys form")
    p.add_argument("--operator", required=True)
    p.add_argument("--node", required=True, help="node name as given to ssh -J")
    p.add_argument("--node-key", required=True, help="the node's host key, authorized_keys form")
    p.add_argument("--login", required=True)
    p.add_argument("--identity", required=True, help="private key file (OpenSSH format)")
    p.add_argument("--dir", required=True, help="an empty directory on the node, absolute")
    a = p.parse_args()

    key = paramiko.Ed25519Key.from_private_key_file(a.identity)
    host, port = a.hub.rsplit(":", 1)
    hub = connect((host, int(port)), a.hub_key, a.operator, key, "bastion")
    chan = hub.open_channel("direct-tcpip", (a.node, 22), ("127.0.0.1", 0), timeout=30)
    node = connect(chan, a.node_key, a.login, key, "node " + a.node)
    sftp = paramiko.SFTPClient.from_transport(node)
    sftp.get_channel().settimeout(60)

    d = a.dir
    data = os.urandom(3 << 20)
    path = d + "/data.bin"
    # A pipelined write: paramiko sends every WRITE without waiting for its
    # status, then collects them at close.
    with sftp.open(path, "wb") as f:
        f.set_pipelined(True)
        for off in range(0, len(data), 32768):
            f.write(data[off:off + 32768])
    check(sftp.stat(path).st_size == len(data), "pipelined write of 3 MiB")
    # getfo prefetches: many READs in flight at once.
    buf = io.BytesIO()
    sftp.getfo(path, buf, prefetch=True)
    check(hashlib.sha256(buf.getvalue()).digest() == hashlib.sha256(data).digest(), "prefetched read of 3 MiB, same bytes")

    sftp.rename(path, d + "/renamed.bin")
    names = sorted(sftp.listdir(d))
    check(names == ["renamed.bin"], f"rename (directory now {names})")

    with sftp.open(d + "/other.bin", "wb") as f:
        f.write(b"to be replaced")
    # posix-rename@openssh.com replaces an existing target, as rename(2).
    sftp.posix_rename(d + "/other.bin", d + "/renamed.bin")
    with sftp.open(d + "/renamed.bin", "rb") as f:
        got = f.read()
    check(got == b"to be replaced" and sorted(sftp.listdir(d)) == ["renamed.bin"], "posix-rename over an existing file")

    sftp.symlink("renamed.bin", d + "/link")
    check(sftp.readlink(d + "/link") == "renamed.bin", "symlink and readlink keep a relative target")
    check(stat.S_ISLNK(sftp.lstat(d + "/link").st_mode), "lstat sees a symlink")

    sftp.chmod(d + "/renamed.bin", 0o640)
    check(stat.S_IMODE(sftp.stat(d + "/renamed.bin").st_mode) == 0o640, "chmod 0640")

    sftp.truncate(d + "/renamed.bin", 2)
    with sftp.open(d + "/renamed.bin", "rb") as f:
        got = f.read()
    check(got == b"to", "truncate to 2 bytes")

    # Last: truncating sets the modification time. The access time is
    # checked on the node's disk by the test: the embedded server's STAT
    # (pkg/sftp) reports the modification time as the access time.
    sftp.utime(d + "/renamed.bin", (1_000_000_000, 1_234_567_890))
    st = sftp.stat(d + "/renamed.bin")
    check(st.st_mtime == 1_234_567_890, f"utime sets mtime (stat: {st.st_mtime})")

    sftp.close()
    node.close()
    hub.close()
    print("ALL OK")


if __name__ == "__main__":
    main()
