#!/usr/bin/env python3
"""Writes the seed corpus under fuzz/corpus/ (run from anywhere; needs only
python3 with its ssl module). Re-running replaces the generated seeds: the
TLS ClientHellos come from OpenSSL and differ each time (random, key
shares); everything else is the same bytes. Files named regress-* are
inputs that once broke an invariant: this script never touches them."""

import io
import os
import ssl
import struct
import tarfile
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def clean(target):
    d = os.path.join(CORPUS, target)
    if os.path.isdir(d):
        for name in os.listdir(d):
            if not name.startswith("regress-"):
                os.remove(os.path.join(d, name))


# ---------------------------------------------------------------- peek ----

def client_hello(server_name, **opts):
    """The first flight OpenSSL sends as a client (one TLS record)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if opts.get("tls12"):
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if opts.get("alpn"):
        ctx.set_alpn_protocols(["h2", "http/1.1"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    try:
        conn.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def reframe(hello, cuts):
    """The handshake of a one-record ClientHello re-split into records that
    end at each offset in `cuts` (offsets into the handshake bytes)."""
    (length,) = struct.unpack(">H", hello[3:5])
    assert len(hello) == 5 + length
    hs = hello[5:]
    out = b""
    start = 0
    for end in list(cuts) + [len(hs)]:
        part = hs[start:end]
        out += hello[0:3] + struct.pack(">H", len(part)) + part
        start = end
    return out


def peek_seeds():
    clean("peek")
    hello = client_hello("pypi.org")
    write("peek", "tls13-sni", hello)
    write("peek", "tls13-alpn-sni", client_hello("files.pythonhosted.org", alpn=True))
    write("peek", "tls12-sni", client_hello("origin.test", tls12=True))
    write("peek", "tls-no-sni", client_hello(None))
    write("peek", "tls-long-sni", client_hello(("a" * 63 + ".") * 3 + "test"))
    write("peek", "tls-split-header", reframe(hello, [2]))
    write("peek", "tls-split-three", reframe(hello, [3, 40, 100]))
    write("peek", "tls-split-every-16", reframe(hello, range(16, len(hello) - 5, 16)))
    write("peek", "tls-trailing-data", hello + b"\x17\x03\x03\x00\x01\x00")
    write("peek", "http-get", b"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\nUser-Agent: x\r\n\r\n")
    write("peek", "http-post-body",
          b"POST /x HTTP/1.1\r\nhost: \t Origin.Test. \r\ncontent-length: 3\r\n\r\nabc")
    write("peek", "http-bare-lf", b"HEAD / HTTP/1.0\nHOST: origin.test\n\n")
    write("peek", "http-ipv6-host", b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\n\r\n")
    write("peek", "http-connect", b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: other.test\r\n\r\n")
    write("peek", "http-absolute",
          b"GET http://user@pypi.org:80/x?y#z HTTP/1.1\r\nHost: other.test\r\n\r\n")
    write("peek", "http-two-hosts", b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n")
    write("peek", "http-folded", b"GET / HTTP/1.1\r\nHost: a.test\r\n b.test\r\n\r\n")
    write("peek", "http-partial", b"OPTIONS * HTTP/1.1\r\nHost: pypi.or")
    write("peek", "ssh", b"SSH-2.0-OpenSSH_9.2\r\n")


# ----------------------------------------------------------------- dns ----

def name(text):
    out = b""
    for label in text.strip(".").split("."):
        if label:
            out += bytes([len(label)]) + label.encode()
    return out + b"\x00"


def header(ident, flags, qd=1, an=0, ns=0, ar=0):
    return struct.pack(">HHHHHH", ident, flags, qd, an, ns, ar)


RD = 0x0100
QR = 0x8000
A, AAAA, CNAME, OPT, ANY = 1, 28, 5, 41, 255


def question(text, qtype, qclass=1):
    return name(text) + struct.pack(">HH", qtype, qclass)


def opt(payload=4096, do=False):
    return b"\x00" + struct.pack(">HHIH", OPT, payload, 0x8000 if do else 0, 0)


def rr(owner, rtype, ttl, rdata):
    """`owner` is wire bytes (a name or a compression pointer)."""
    return owner + struct.pack(">HHIH", rtype, 1, ttl, len(rdata)) + rdata


def dns_seeds():
    clean("dns")
    write("dns", "a-static", header(0x1234, RD) + question("origin.test", A))
    write("dns", "aaaa-static", header(0x1235, RD) + question("v6.test", AAAA))
    write("dns", "a-many-edns", header(7, RD, ar=1) + question("many.test", A) + opt(4096, True))
    write("dns", "a-many-classic", header(8, RD) + question("many.test", A))
    write("dns", "any-static", header(9, RD) + question("origin.test", ANY))
    write("dns", "a-forwarded", header(10, RD) + question("PyPi.OrG", A))
    write("dns", "a-wildcard", header(11, RD) + question("files.pythonhosted.org", AAAA))
    write("dns", "a-denied-name", header(12, RD) + question("evil.pythonhosted.org", A))
    write("dns", "a-refused", header(13, RD) + question("evil.example", A))
    write("dns", "underscore", header(14, 0) + question("_dmarc.pypi.org", 16))
    # A second question named by a compression pointer to the first: FORMERR.
    two = header(15, RD, qd=2) + question("origin.test", A) + b"\xc0\x0c" + struct.pack(">HH", A, 1)
    write("dns", "two-questions-pointer", two)
    # A question whose name points at itself.
    write("dns", "pointer-loop", header(16, RD) + b"\xc0\x0c" + struct.pack(">HH", A, 1))
    write("dns", "opcode-update", header(17, 0x2800) + question("origin.test", A))
    write("dns", "a-response", header(18, QR | RD) + question("origin.test", A))
    write("dns", "edns-small", header(19, RD, ar=1) + question("many.test", A) + opt(100))


def upstream_seeds():
    clean("dns_upstream")
    q = question("pypi.org", A)
    # pypi.org CNAME cdn.pypi.org (pointer into the question), its A
    # records, and an unsolicited record for another name.
    cname_target = b"\x03cdn\xc0\x0c"
    answers = (
        rr(b"\xc0\x0c", CNAME, 300, cname_target)
        + rr(b"\xc0\x26", A, 60, bytes([198, 18, 2, 1]))
        + rr(b"\xc0\x26", A, 60, bytes([198, 18, 2, 2]))
        + rr(name("evil.example"), A, 60, bytes([198, 18, 9, 9]))
    )
    write("dns_upstream", "cname-chain",
          header(0x4242, QR | RD | 0x80, an=4) + q + answers)
    write("dns_upstream", "a-plain",
          header(0x4243, QR | RD | 0x80, an=1) + q + rr(b"\xc0\x0c", A, 30, bytes([198, 18, 0, 7])))
    six = question("v6.test", AAAA)
    write("dns_upstream", "aaaa",
          header(1, QR | RD | 0x80, an=1, ar=1) + six
          + rr(b"\xc0\x0c", AAAA, 60, bytes.fromhex("20010db8000000000000000000000002")) + opt())
    write("dns_upstream", "truncated", header(2, QR | RD | 0x80 | 0x0200) + q)
    write("dns_upstream", "servfail-no-question", header(3, QR | RD | 0x80 | 2, qd=0))
    # A CNAME loop: a -> b -> a.
    loop_q = question("a.test", A)
    loop = rr(b"\xc0\x0c", CNAME, 60, b"\x01b\xc0\x0e") + rr(b"\x01b\xc0\x0e", CNAME, 60, b"\xc0\x0c")
    write("dns_upstream", "cname-loop", header(4, QR | 0x80, an=2) + loop_q + loop)
    big = b"".join(rr(b"\xc0\x0c", A, 60, bytes([198, 18, 3, i])) for i in range(60))
    write("dns_upstream", "many-answers", header(5, QR | 0x80, an=60) + q + big)


# -------------------------------------------------------- policy, bundle ----

def copy(target, src, dst):
    with open(os.path.join(ROOT, src), "rb") as f:
        write(target, dst, f.read())


DESIGN_POLICY = b"""version: 1
name: agent-default
mode: enforce
rules:
  - name: origin
    action: allow
    cidrs: ["198.18.0.1/32", "2001:db8::/64"]
    ports: [8080, "9000-9100"]
  - name: package-index
    action: allow
    hosts: ["pypi.org", "*.pythonhosted.org"]
    ports: [443]
  - name: no-metadata
    action: deny
    cidrs: ["169.254.169.254/32"]
dns:
  upstream: ["198.18.0.53:53"]
  hosts: { "origin.test": ["198.18.0.1"] }
"""


def policy_seeds():
    clean("policy")
    copy("policy", "policies/dev.yaml", "dev.yaml")
    copy("policy", "policies/demo.yaml", "demo.yaml")
    write("policy", "design.yaml", DESIGN_POLICY)
    write("policy", "audit-mode.yaml", DESIGN_POLICY.replace(b"mode: enforce", b"mode: audit"))
    write("policy", "errors.yaml",
          b"version: 2\nname: x\nmode: block\nrules:\n  - name: a\n    action: allow\n"
          b"    cidrs: [\"300.1.2.3/8\"]\n    ports: [0, \"9-1\"]\n    hostz: []\n")
    write("policy", "anchors.yaml",
          b"version: 1\nname: x\nrules:\n  - &r {name: a, action: allow, cidrs: [\"198.18.0.1/32\"]}\n  - *r\n")


def tar_of(directory):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for entry in sorted(os.listdir(directory)):
            info = tar.gettarinfo(os.path.join(directory, entry), arcname=entry)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(os.path.join(directory, entry), "rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


def bundle_seeds():
    clean("manifest")
    clean("bundle")
    copy("manifest", "bundles/examples/dev/manifest.yaml", "dev.yaml")
    write("manifest", "two-files.yaml",
          b"name: dev\nrevision: 18446744073709551615\ncreated: 2026-01-01T00:00:00Z\n"
          b"expires: 2036-01-01T00:00:00Z\nkey_id: dev\nfiles:\n"
          b"  policy.yaml: " + b"ab" * 32 + b"\n  extra.txt: " + b"CD" * 32 + b"\n")
    write("manifest", "bad-fields.yaml",
          b"name: ../dev\nrevision: -1\ncreated: yesterday\nexpires: 2036-01-01T00:00:00Z\n"
          b"key_id: dev\nfiles: {}\nextra: 1\n")
    copy("bundle", "bundles/examples/dev.tar.gz", "dev.tar.gz")
    write("bundle", "dev.tar", tar_of(os.path.join(ROOT, "bundles/examples/dev")))


if __name__ == "__main__":
    peek_seeds()
    dns_seeds()
    upstream_seeds()
    policy_seeds()
    bundle_seeds()
    for target in sorted(os.listdir(CORPUS)):
        print(target, len(os.listdir(os.path.join(CORPUS, target))), "seeds")
