#!/usr/bin/env python3
"""A pull-only OCI registry for the slow-pull tests: it serves one image,
made at start from an OCI archive (as tests/cluster/load-image and
build-images write them) plus one layer of fresh random bytes, so that
containerd has never seen the image and must download that layer. Blob
bodies are sent no faster than --rate bytes a second.

Usage: slow_registry.py --base-archive FILE --name REPO --tag TAG
                        --fresh-layer-bytes N --rate BYTES_PER_S [--bind IP]

Serves the distribution API's read side (plain HTTP, no auth):
  GET /v2/
  HEAD|GET /v2/REPO/manifests/(TAG|DIGEST)   Content-Type, Docker-Content-Digest
  HEAD|GET /v2/REPO/blobs/DIGEST             throttled body; `Range: bytes=N-`

Binds port 0 (default on 127.0.0.1). Every line on stdout is an event, so
a test can wait on them; each is flushed at once:
  image MANIFEST CONFIG          the image's manifest and config digests (first
                                 line; the config digest is its image id)
  fresh-layer DIGEST SIZE        the layer containerd does not have (second line)
  listening PORT                 accepting connections (third line)
  request METHOD PATH STATUS
  blob-start DIGEST FROM SIZE    a blob body begins (FROM > 0: a ranged resume)
  blob-done DIGEST SIZE SECONDS  the whole body was sent
  blob-aborted DIGEST SENT SIZE ERROR   the client went away first
  error TEXT                     a malformed request (for example TLS sent to
                                 this plain-HTTP server)
"""
import argparse, hashlib, http.server, io, json, os, re, sys, tarfile, threading, time

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
CHUNK = 4096
LOCK = threading.Lock()


def event(text):
    with LOCK:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-archive", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--fresh-layer-bytes", type=int, required=True)
    parser.add_argument("--rate", type=int, required=True, help="bytes a second for blob bodies")
    parser.add_argument("--bind", default="127.0.0.1")
    return parser.parse_args()


def digest_of(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(obj):
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def read_base(path):
    """The base image's manifest, config and blobs, from an OCI archive
    holding one image (index.json -> manifest -> config and layers)."""
    blobs = {}
    with tarfile.open(path) as archive:
        def member(name):
            return archive.extractfile(name).read()

        index = json.loads(member("index.json"))
        manifest_digest = index["manifests"][0]["digest"]

        def blob(digest):
            data = member("blobs/sha256/" + digest.split(":", 1)[1])
            blobs[digest] = data
            return data

        manifest = json.loads(blob(manifest_digest))
        config = json.loads(blob(manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            blob(layer["digest"])
    return manifest, config, blobs


def fresh_layer(size):
    """An uncompressed layer holding one file of `size` random bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        info = tarfile.TarInfo("fresh-random-bytes")
        info.size, info.mode, info.mtime = size, 0o444, int(time.time())
        layer.addfile(info, io.BytesIO(os.urandom(size)))
    return buffer.getvalue()


def build_image(args):
    """The base image with the fresh layer on top; returns the manifest's
    bytes, every blob by digest, the config's digest and the fresh layer's."""
    manifest, config, blobs = read_base(args.base_archive)
    layer = fresh_layer(args.fresh_layer_bytes)
    layer_digest = digest_of(layer)
    blobs[layer_digest] = layer
    # An uncompressed layer's diff id is its own digest.
    config["rootfs"]["diff_ids"].append(layer_digest)
    config.setdefault("history", []).append({"created_by": "tests/support/slow_registry.py: fresh random layer"})
    config_bytes = canonical(config)
    blobs[digest_of(config_bytes)] = config_bytes
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": manifest["config"]["mediaType"], "digest": digest_of(config_bytes), "size": len(config_bytes)},
        "layers": manifest["layers"] + [{"mediaType": OCI_LAYER, "digest": layer_digest, "size": len(layer)}],
    }
    return canonical(manifest), blobs, digest_of(config_bytes), layer_digest


ARGS = parse_args()
MANIFEST, BLOBS, CONFIG_DIGEST, FRESH_DIGEST = build_image(ARGS)
MANIFEST_DIGEST = digest_of(MANIFEST)
ROUTE = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A client that stalls holds only its own thread, and not for ever.
    timeout = 60

    def do_GET(self):
        self.serve(body=True)

    def do_HEAD(self):
        self.serve(body=False)

    def serve(self, body):
        path = self.path.split("?", 1)[0]
        if path in ("/v2", "/v2/"):
            return self.reply(200, "application/json", b"{}", body)
        match = ROUTE.match(path)
        if not match or match["name"] != ARGS.name:
            return self.not_found("NAME_UNKNOWN", body)
        ref = match["ref"]
        if match["kind"] == "manifests":
            if ref not in (ARGS.tag, MANIFEST_DIGEST):
                return self.not_found("MANIFEST_UNKNOWN", body)
            return self.reply(200, OCI_MANIFEST, MANIFEST, body, {"Docker-Content-Digest": MANIFEST_DIGEST})
        data = BLOBS.get(ref)
        if data is None:
            return self.not_found("BLOB_UNKNOWN", body)
        self.send_blob(ref, data, body)

    def send_blob(self, digest, data, body):
        start = 0
        ranged = re.match(r"^bytes=(\d+)-$", self.headers.get("Range", ""))
        if ranged and int(ranged[1]) < len(data):
            start = int(ranged[1])
        self.send_response(206 if start else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Docker-Content-Digest", digest)
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.end_headers()
        if not body:
            return
        event("blob-start %s %d %d" % (digest, start, len(data)))
        began, sent = time.monotonic(), 0
        try:
            while start + sent < len(data):
                chunk = data[start + sent : start + sent + CHUNK]
                self.wfile.write(chunk)
                sent += len(chunk)
                # Sleep until the bytes sent so far fit the rate.
                ahead = began + sent / ARGS.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            self.wfile.flush()
        except OSError as error:
            event("blob-aborted %s %d %d %s" % (digest, start + sent, len(data), type(error).__name__))
            self.close_connection = True
            return
        event("blob-done %s %d %.1f" % (digest, len(data), time.monotonic() - began))

    def not_found(self, code, body):
        payload = canonical({"errors": [{"code": code, "message": "not here", "detail": self.path}]})
        self.reply(404, "application/json", payload, body)

    def reply(self, status, content_type, payload, body, headers=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def log_request(self, code="-", size="-"):
        # A request that could not be parsed has no method or path.
        event("request %s %s %s" % (getattr(self, "command", None) or "-", getattr(self, "path", None) or "-", code))

    def log_error(self, format, *args):
        # A TLS ClientHello sent to this plain-HTTP server lands here, as
        # a bad request line: one printable line, whatever the bytes were.
        event("error %s" % (format % args).encode("ascii", "backslashreplace").decode())


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


server = Server((ARGS.bind, 0), Handler)
event("image %s %s" % (MANIFEST_DIGEST, CONFIG_DIGEST))
event("fresh-layer %s %d" % (FRESH_DIGEST, len(BLOBS[FRESH_DIGEST])))
event("listening %d" % server.server_address[1])
server.serve_forever()
