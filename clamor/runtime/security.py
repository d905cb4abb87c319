"""Who may talk to a cluster: the join secret, the keys made from it, and
what every socket does with them.

DESIGN.  A cluster has one secret, a string: ``Cluster(secret=...)``, else
CLAMOR_SECRET, else a fresh random one per Cluster.  Every member derives
two CURVE key pairs from it (BLAKE2b, keyed by purpose):

- the *server* pair: every socket that listens (the driver's control
  socket, every page server, every block server) is a CURVE server with
  its secret key, and every socket that connects expects its public key;
- the *member* pair: every socket that connects presents it.

A listening socket admits a peer only through a ZAP handler that checks
the peer presented the member public key (``Guard`` here for Python's
sockets, csrc/security.c for the core's), and sets ZMQ_ZAP_ENFORCE_DOMAIN
so that without the handler it admits nobody.  CURVE's handshake proves
the peer holds the matching secret key, and so the cluster's secret;
libzmq hands clamor no frame of a peer before the handshake is done, so
nothing an outsider sends is parsed or unpickled.  A peer without the
secret does not even know the server key, and its handshake fails before
ZAP is asked: the Guard logs one line for it.

With ``encrypt=False`` the sockets use PLAIN instead: user "clamor" and a
token derived from the secret, checked by the same handlers.  That
authenticates but does not encrypt, and the token crosses the network in
the clear: for trusted networks only.

The keys follow the secret: the default secret is new for every Cluster,
so are the keys; a secret given by the user keeps them across clusters.
"""
import errno
import hashlib
import logging
import os
import secrets
import threading
import time

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from .. import errors
from .._native import lib
from ..memory.gate import Gated
from ..memory import region

log = logging.getLogger("clamor.security")

MIN_SECRET = 16          # characters
ZAP_DOMAIN = b"clamor"
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | \
    zmq.EVENT_HANDSHAKE_FAILED_AUTH


def new_secret():
    """A fresh random secret (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def read_secret_file(path):
    """The secret held in the file ``path`` (surrounding whitespace dropped);
    ConfigError if it cannot be read or is too short."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise errors.ConfigError(f"cannot read the secret file {path}: {err}") from err
    return check_secret(text, f"the secret in {path}")


def check_secret(secret, what="the cluster's secret"):
    if not isinstance(secret, str):
        raise errors.ConfigError(f"{what} must be a string, not {type(secret).__name__}")
    if len(secret) < MIN_SECRET:
        raise errors.ConfigError(f"{what} is too short: at least {MIN_SECRET} characters (clamor makes a random "
                                 f"one if none is given)")
    return secret


def _derive(secret, purpose):
    return hashlib.blake2b(secret.encode(), key=b"clamor " + purpose, digest_size=32).digest()


class Security:
    """The keys of one secret, and how sockets use them."""

    def __init__(self, secret, encrypt=True):
        self.secret = check_secret(secret)
        self.encrypt = bool(encrypt)
        self.server_secret = z85.encode(_derive(secret, b"server"))
        self.server_public = zmq.curve_public(self.server_secret)
        self.member_secret = z85.encode(_derive(secret, b"member"))
        self.member_public = zmq.curve_public(self.member_secret)
        self.token = _derive(secret, b"plain").hex().encode()

    @property
    def mode(self):
        return "curve" if self.encrypt else "plain"

    def __reduce__(self):
        raise errors.NotSerializable("a cluster's security travels only to processes it forks")

    def server(self, sock):
        """Make ``sock`` (before it binds) admit members only."""
        sock.zap_domain = ZAP_DOMAIN
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        if self.encrypt:
            sock.curve_server = True
            sock.curve_secretkey = self.server_secret
        else:
            sock.plain_server = True

    def client(self, sock):
        """Make ``sock`` (before it connects) prove membership."""
        if self.encrypt:
            sock.curve_serverkey = self.server_public
            sock.curve_publickey = self.member_public
            sock.curve_secretkey = self.member_secret
        else:
            sock.plain_username = b"clamor"
            sock.plain_password = self.token

    def core(self):
        """The same for every socket the C core opens from now on."""
        region.secure(self.mode, self.server_public, self.server_secret, self.member_public, self.member_secret,
                      self.token)

    def admits(self, mechanism, credentials):
        if self.encrypt:
            return mechanism == b"CURVE" and credentials[:1] == [z85.decode(self.member_public)]
        return mechanism == b"PLAIN" and credentials[1:2] == [self.token]


class Guard(threading.Thread):
    """A process's ZAP handler for the sockets of ``ctx``, which also logs
    handshakes that failed on the sockets passed to ``watch`` (before they
    bind): one line per socket, then at most one a minute with a count.

    It runs Python code only between clamor.heap() blocks of this process:
    what it frees (a request's frames) goes to the interpreter's free lists,
    which a block's objects would come from.  It waits for its sockets and
    then for the gate in C (csrc/pygate.c), so nothing is made or freed
    between the two."""

    def __init__(self, ctx, security, name="clamor"):
        super().__init__(name="clamor-guard", daemon=True)
        self.security = security
        self.where = name
        self.zap = ctx.socket(zmq.REP)
        self.zap.linger = 0
        self.zap.bind("inproc://zeromq.zap.01")
        self.monitors = {}
        # woken only by a request, a failed handshake or stop(), never on a
        # timer: each wake-up waits for the heap() blocks to end
        self._wake = ctx.socket(zmq.PAIR)
        self._wake.linger = 0
        self._wake.bind(f"inproc://clamor-guard-{id(self):x}")
        self._waker = ctx.socket(zmq.PAIR)
        self._waker.linger = 0
        self._waker.connect(f"inproc://clamor-guard-{id(self):x}")
        self.stopping = threading.Event()
        self._gated = Gated()
        self.admitted = self.refused = 0

    def watch(self, sock, what):
        self.monitors[sock.get_monitor_socket(_FAILED)] = [what, 0, 0.0]   # failures, last logged

    def run(self):
        socks = [self.zap, self._wake, *self.monitors]
        if len(socks) > lib.CLAMOR_GATE_MAX_SOCKETS:
            raise errors.ClamorError(f"a guard watches at most {lib.CLAMOR_GATE_MAX_SOCKETS - 2} sockets")
        gated = self._gated
        gated.set_sockets(socks)
        try:
            while not self.stopping.is_set():
                rc = gated.wait()
                if rc == -errno.ECANCELED:
                    break
                try:
                    if rc == -errno.EINTR:
                        continue
                    if rc < 0:             # the context ended (ETERM), or worse
                        if -rc != zmq.ETERM:
                            log.error("%s: the handshake handler stopped: %s", self.where, zmq.strerror(-rc))
                        break
                    self._serve(socks, gated)
                finally:
                    gated.done()
        finally:
            for m in self.monitors:
                m.close()
            self.zap.close()
            self._wake.close()

    def _serve(self, socks, gated):
        try:
            for i, sock in enumerate(socks):
                if not gated.ready(i):
                    continue
                if sock is self.zap:
                    self._answer()
                elif sock is self._wake:
                    self._wake.recv(zmq.NOBLOCK)
                else:
                    self._failed(sock)
        except zmq.ZMQError:
            pass

    def _answer(self):
        frames = self.zap.recv_multipart()
        ok = (len(frames) >= 6 and frames[0] == b"1.0" and frames[2] == ZAP_DOMAIN
              and self.security.admits(frames[5], frames[6:]))
        if ok:
            self.admitted += 1
        else:
            self.refused += 1
            log.warning("%s: refused a peer at %s that is not a member of this cluster", self.where,
                        frames[3].decode(errors="replace") if len(frames) > 3 else "?")
        rid = frames[1] if len(frames) > 1 else b""
        self.zap.send_multipart([b"1.0", rid, b"200" if ok else b"400", b"OK" if ok else b"not a member", b"", b""])

    def _failed(self, mon):
        try:
            recv_monitor_message(mon)
        except zmq.ZMQError:
            return
        state = self.monitors[mon]
        state[1] += 1
        now = time.monotonic()
        if state[1] == 1 or now - state[2] >= 60:
            log.warning("%s: a peer failed the handshake on the %s (it does not hold this cluster's secret); "
                        "%d so far", self.where, state[0], state[1])
            state[2] = now

    def stop(self):
        self.stopping.set()
        self._gated.stop()            # even while another thread holds a heap() block open
        try:
            self._waker.send(b"", flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self.join(2)
        self._waker.close()


def control_socket(ctx, security, where):
    """A ROUTER of ``ctx`` that admits members only, and the started Guard
    that answers its handshakes (logging failed ones as ``where``'s): the
    caller binds the socket, then closes it and stops the guard."""
    guard = Guard(ctx, security, where)
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    security.server(sock)
    guard.watch(sock, "control endpoint")
    guard.start()
    return sock, guard


def from_environment(secret=None, path=None):
    """The secret given, else the one in ``path``, else CLAMOR_SECRET, else
    None."""
    if secret is not None:
        return check_secret(secret)
    if path is not None:
        return read_secret_file(path)
    env = os.environ.get("CLAMOR_SECRET")
    if env:
        return check_secret(env.strip(), "CLAMOR_SECRET")
    return None
