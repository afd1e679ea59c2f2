#!/usr/bin/env python3
"""A token-protected git server over HTTPS for the clone tests: `git
http-backend` (smart HTTP, protocol v2, fetch by SHA allowed by the
repositories' own config) behind a small HTTP server that answers 401 unless
the Basic password equals the token.

Usage: git_server.py --bind IP --root DIR --token-file FILE --cert FILE --key FILE
Prints one line `listening PORT` on stdout once it accepts connections; logs
on stderr one line per accepted connection (peer address), per finished or
failed TLS handshake and per request (method, path, status; never the
Authorization header), each with the time, so a clone that never reached
the server can be told from one that stalled in the handshake.
"""
import argparse, base64, http.server, os, ssl, subprocess, sys, time


def log(text):
    sys.stderr.write("git-server %s: %s\n" % (time.strftime("%H:%M:%S"), text))
    sys.stderr.flush()


def parse_args():
    parser = argparse.ArgumentParser()
    for name in ("--bind", "--root", "--token-file", "--cert", "--key"):
        parser.add_argument(name, required=True)
    return parser.parse_args()


ARGS = parse_args()
with open(ARGS.token_file) as token_file:
    TOKEN = token_file.read().strip()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A client that stalls holds only its own thread, and not for ever.
    timeout = 30

    def setup(self):
        # The TLS handshake runs here, in the connection's thread: wrapping
        # the listening socket would run it inside accept(), where one
        # stalled client would block every other. The timeout is set
        # first, so a handshake that stalls ends too (super().setup() sets
        # it only after).
        peer = "%s:%s" % self.client_address[:2]
        log("%s connected" % peer)
        self.request.settimeout(self.timeout)
        try:
            self.request = CONTEXT.wrap_socket(self.request, server_side=True)
        except OSError as error:
            log("%s TLS handshake failed: %s" % (peer, error))
            raise
        log("%s TLS handshake done" % peer)
        super().setup()

    def do_GET(self):
        self.serve()

    def do_POST(self):
        self.serve()

    def authorized(self):
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            _, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except Exception:
            return False
        return password == TOKEN

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))

    def serve(self):
        body = self.read_body()
        if not self.authorized():
            self.reply(401, {"WWW-Authenticate": 'Basic realm="git"', "Content-Type": "text/plain"}, b"token required\n")
            return
        path, _, query = self.path.partition("?")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": ARGS.root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": "test",
            "REMOTE_ADDR": self.client_address[0],
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
        }
        result = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
        head, _, payload = result.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = result.stdout.partition(b"\n\n")
        status, headers = 200, {}
        for line in head.decode(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers[name.strip()] = value.strip()
        if result.returncode != 0 and status == 200:
            status, payload = 500, result.stderr
        self.reply(status, headers, payload)

    def reply(self, status, headers, payload):
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format, *args):
        log("%s %s" % (self.client_address[0], format % args))


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # One line instead of socketserver's traceback; the handshake
        # failure itself was logged by Handler.setup.
        log("%s:%s connection ended with an error: %r" % (client_address[0], client_address[1], sys.exc_info()[1]))


CONTEXT = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
CONTEXT.load_cert_chain(ARGS.cert, ARGS.key)
server = Server((ARGS.bind, 0), Handler)
print("listening %d" % server.server_address[1], flush=True)
server.serve_forever()
