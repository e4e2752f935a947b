"""A small fake of the Hugging Face Hub HTTP API for tests (standard library only).

It implements just what ``huggingface_hub`` (with ``HF_HUB_DISABLE_XET=1``) and ``datasets`` call for
``create_repo``, ``create_commit`` (preupload, LFS batch + PUT, ndjson commit), ``create_tag``,
``list_repo_refs``, ``list_repo_tree``, ``get_paths_info``, ``repo_info``, ``snapshot_download`` and
``load_dataset(repo, config, revision=tag)``.  Every commit keeps its own file table, so a tag resolves to
exactly the files of the commit it points at.

State lives under ``root``: file contents in ``root/objects/<sha256>``, one JSON file per repository and a
request log (method, path, status).  Request headers are never stored, so an ``Authorization`` token
cannot end up on disk.  Routes the fake does not know are answered 404 and listed in ``unhandled``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

GITATTRIBUTES = (
    b"*.arrow filter=lfs diff=lfs merge=lfs -text\n"
    b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
    b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    b"*.zst filter=lfs diff=lfs merge=lfs -text\n"
)
LFS_SUFFIXES = (".parquet", ".arrow", ".bin", ".safetensors", ".zst", ".gz", ".zip", ".npy", ".pt")
LFS_MIN_SIZE = 10 * 1024 * 1024
TYPE_PREFIX = {"datasets": "datasets/", "spaces": "spaces/", "models": ""}
TYPE_SINGULAR = {"datasets": "dataset", "spaces": "space", "models": "model"}
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra or {}


class FakeHub:
    """In-process fake Hub: ``with FakeHub(root, token=...) as hub: hub.endpoint``."""

    def __init__(self, root: Path, token: str | None = None, lfs_min_size: int = LFS_MIN_SIZE):
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.repos_dir = self.root / "repos"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.repos_dir.mkdir(parents=True, exist_ok=True)
        self._token = token  # compared in memory only; never written
        self.lfs_min_size = lfs_min_size
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str, int]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.auth_failures = 0
        self._counter = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> str:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fakehub", daemon=True)
        self._thread.start()
        return self.endpoint

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> FakeHub:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- storage
    def _repo_file(self, rtype: str, repo_id: str) -> Path:
        return self.repos_dir / rtype / f"{repo_id}.json"

    def load_repo(self, rtype: str, repo_id: str) -> dict[str, Any]:
        p = self._repo_file(rtype, repo_id)
        if not p.exists():
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return json.loads(p.read_text(encoding="utf-8"))

    def save_repo(self, rtype: str, repo_id: str, state: dict[str, Any]) -> None:
        p = self._repo_file(rtype, repo_id)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(p)

    def put_object(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        p = self.objects / sha
        if not p.exists():
            tmp = p.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_bytes(data)
            tmp.replace(p)
        return sha

    def get_object(self, sha: str) -> bytes:
        return (self.objects / sha).read_bytes()

    def has_object(self, sha: str) -> bool:
        return (self.objects / sha).exists()

    def _now(self) -> str:
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    def new_commit(
        self, state: dict, parent: str | None, files: dict[str, dict], summary: str, description: str = ""
    ) -> str:
        self._counter += 1
        body = json.dumps([parent, files, summary, description, self._counter, self._now()], sort_keys=True)
        oid = hashlib.sha1(body.encode()).hexdigest()
        state["commits"][oid] = {
            "parent": parent,
            "files": files,
            "summary": summary,
            "description": description,
            "date": self._now(),
        }
        return oid

    def file_entry(self, data: bytes, lfs: bool) -> dict[str, Any]:
        sha = self.put_object(data)
        oid = git_blob_oid(lfs_pointer(sha, len(data))) if lfs else git_blob_oid(data)
        return {"sha256": sha, "size": len(data), "lfs": lfs, "oid": oid}

    # ---------------------------------------------------------------- revisions
    @staticmethod
    def resolve(state: dict, rev: str) -> str:
        rev = rev or "main"
        if rev in state["branches"]:
            return state["branches"][rev]
        if rev in state["tags"]:
            return state["tags"][rev]
        for prefix, table in (("refs/heads/", "branches"), ("refs/tags/", "tags")):
            if rev.startswith(prefix) and rev[len(prefix) :] in state[table]:
                return state[table][rev[len(prefix) :]]
        if COMMIT_RE.match(rev):
            hits = [c for c in state["commits"] if c.startswith(rev)]
            if len(hits) == 1:
                return hits[0]
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def commit_files(self, rtype: str, repo_id: str, rev: str) -> tuple[str, dict[str, dict]]:
        state = self.load_repo(rtype, repo_id)
        oid = self.resolve(state, rev)
        return oid, state["commits"][oid]["files"]

    def last_commit(self, state: dict, head: str, path: str) -> dict[str, str]:
        """The newest commit reachable from ``head`` that changed ``path`` (file or folder)."""

        def view(commit: dict) -> Any:
            files = commit["files"]
            if path in files:
                return files[path]["oid"]
            return sorted((p, e["oid"]) for p, e in files.items() if p.startswith(path + "/"))

        oid = head
        while True:
            commit = state["commits"][oid]
            parent = commit["parent"]
            if parent is None or view(state["commits"][parent]) != view(commit):
                return {"id": oid, "title": commit["summary"], "date": commit["date"]}
            oid = parent

    # ---------------------------------------------------------------- listings
    def tree_entries(
        self, state: dict, head: str, files: dict[str, dict], base: str, recursive: bool, expand: bool
    ) -> list[dict[str, Any]]:
        base = base.strip("/")
        prefix = base + "/" if base else ""
        out: dict[str, dict[str, Any]] = {}
        for path, entry in sorted(files.items()):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :].split("/")
            # parent folders of the file, below the listed folder
            depth = len(rest) - 1 if recursive else min(1, len(rest) - 1)
            for i in range(depth):
                folder = prefix + "/".join(rest[: i + 1])
                if folder not in out:
                    out[folder] = self.folder_entry(files, folder)
            if recursive or len(rest) == 1:
                out[path] = self.file_json(path, entry)
        if base and not out:
            raise HubError(404, f"Path {base} not found", "EntryNotFound")
        result = [out[k] for k in sorted(out)]
        if expand:
            for item in result:
                item["lastCommit"] = self.last_commit(state, head, item["path"])
        return result

    @staticmethod
    def folder_entry(files: dict[str, dict], folder: str) -> dict[str, Any]:
        inner = sorted((p, e["oid"]) for p, e in files.items() if p.startswith(folder + "/"))
        oid = hashlib.sha1(json.dumps(inner).encode()).hexdigest()
        return {"type": "directory", "oid": oid, "size": 0, "path": folder}

    @staticmethod
    def file_json(path: str, entry: dict) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": path}
        if entry["lfs"]:
            pointer = lfs_pointer(entry["sha256"], entry["size"])
            item["lfs"] = {"oid": entry["sha256"], "size": entry["size"], "pointerSize": len(pointer)}
        return item

    def repo_json(self, rtype: str, repo_id: str, state: dict, oid: str) -> dict[str, Any]:
        commit = state["commits"][oid]
        return {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "author": repo_id.split("/")[0],
            "sha": oid,
            "lastModified": commit["date"],
            "createdAt": state["created"],
            "private": state["private"],
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": [{"rfilename": p} for p in sorted(commit["files"])],
            "cardData": {},
            "usedStorage": sum(e["size"] for e in commit["files"].values()),
        }


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet; requests are kept in fake.requests
        pass

    # ---------------------------------------------------------------- plumbing
    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = headers or {}
        headers.setdefault("Content-Type", "application/json")
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._status = status

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _authorized(self) -> bool:
        if self.fake._token is None:
            return True
        return self.headers.get("Authorization", "") == f"Bearer {self.fake._token}"

    def _require_auth(self) -> None:
        if not self._authorized():
            self.fake.auth_failures += 1
            raise HubError(401, "Invalid credentials in Authorization header")

    def _dispatch(self) -> None:
        self._status = 0
        self._payload = self._body() if self.command in ("POST", "PUT", "DELETE") else b""
        split = urlsplit(self.path)
        self._query = parse_qs(split.query)
        # split the raw path first: a quoted '/' inside a revision stays one segment
        self._segments = [unquote(s) for s in split.path.split("/")[1:]]
        try:
            if not self._route():
                self.fake.unhandled.append((self.command, split.path))
                raise HubError(404, f"fakehub: no route for {self.command} {split.path}")
        except HubError as err:
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            self._json(err.status, {"error": err.message, **err.extra}, headers)
        except Exception as exc:  # a bug in the fake: answer 500 instead of hanging the client
            self._json(500, {"error": f"fakehub internal error: {type(exc).__name__}: {exc}"})
        finally:
            with self.fake.lock:
                self.fake.requests.append((self.command, split.path, self._status))
                with (self.fake.root / "requests.log").open("a", encoding="utf-8") as log:
                    log.write(f"{self.command} {split.path} {self._status}\n")

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _dispatch

    # ---------------------------------------------------------------- routing
    def _route(self) -> bool:
        seg, cmd = self._segments, self.command
        if seg[:1] == ["api"]:
            if seg[1:] == ["repos", "create"] and cmd == "POST":
                return self.create_repo()
            if seg[1:] == ["validate-yaml"] and cmd == "POST":
                self._json(200, {"errors": [], "warnings": []})
                return True
            if len(seg) >= 4 and seg[1] in TYPE_PREFIX:
                rtype, repo_id, rest = seg[1], f"{seg[2]}/{seg[3]}", seg[4:]
                return self.api_repo(rtype, repo_id, rest)
            return False
        if seg[:1] == ["_fake_lfs"] and len(seg) == 2 and cmd == "PUT":
            return self.lfs_put(seg[1])
        rtype = "models"
        if seg[:1] in (["datasets"], ["spaces"]):
            rtype, seg = seg[0], seg[1:]
        if len(seg) >= 2 and seg[1].endswith(".git") and seg[2:] == ["info", "lfs", "objects", "batch"]:
            return self.lfs_batch(rtype, f"{seg[0]}/{seg[1][:-4]}")
        if len(seg) >= 5 and seg[2] == "resolve" and cmd in ("GET", "HEAD"):
            return self.resolve_file(rtype, f"{seg[0]}/{seg[1]}", seg[3], "/".join(seg[4:]))
        return False

    def api_repo(self, rtype: str, repo_id: str, rest: list[str]) -> bool:
        cmd = self.command
        fake = self.fake
        if not rest and cmd == "GET":
            return self.repo_info(rtype, repo_id, "main")
        if not rest and cmd == "DELETE":
            return False
        head, args = rest[0], rest[1:]
        if head == "revision" and cmd == "GET" and args:
            return self.repo_info(rtype, repo_id, "/".join(args))
        if head == "refs" and cmd == "GET":
            state = fake.load_repo(rtype, repo_id)

            def refs(table: str, kind: str) -> list[dict]:
                return [
                    {"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": c}
                    for n, c in sorted(state[table].items())
                ]

            body = {"branches": refs("branches", "heads"), "tags": refs("tags", "tags")}
            self._json(200, {**body, "converts": [], "pullRequests": []})
            return True
        if head == "tree" and cmd == "GET" and args:
            return self.tree(rtype, repo_id, args[0], "/".join(args[1:]))
        if head == "paths-info" and cmd == "POST" and args:
            return self.paths_info(rtype, repo_id, "/".join(args))
        if head == "preupload" and cmd == "POST" and args:
            return self.preupload(rtype, repo_id, "/".join(args))
        if head == "commit" and cmd == "POST" and args:
            return self.commit(rtype, repo_id, "/".join(args))
        if head == "tag" and cmd == "POST" and args:
            return self.create_tag(rtype, repo_id, "/".join(args))
        if head == "tag" and cmd == "DELETE" and args:
            return self.delete_ref(rtype, repo_id, "tags", "/".join(args))
        if head == "branch" and cmd == "POST" and args:
            return self.create_branch(rtype, repo_id, "/".join(args))
        if head == "branch" and cmd == "DELETE" and args:
            return self.delete_ref(rtype, repo_id, "branches", "/".join(args))
        return False

    # ---------------------------------------------------------------- write endpoints
    def create_repo(self) -> bool:
        self._require_auth()
        payload = json.loads(self._payload or b"{}")
        org, name = payload.get("organization"), payload.get("name")
        if not org or not name:
            raise HubError(400, "fakehub needs an organization and a name")
        rtype = {"dataset": "datasets", "space": "spaces"}.get(payload.get("type") or "model", "models")
        repo_id = f"{org}/{name}"
        url = f"{self.fake.endpoint}/{TYPE_PREFIX[rtype]}{repo_id}"
        with self.fake.lock:
            if self.fake._repo_file(rtype, repo_id).exists():
                raise HubError(409, "You already created this repo", extra={"url": url})
            state: dict[str, Any] = {
                "private": payload.get("private", payload.get("visibility") == "private"),
                "created": self.fake._now(),
                "commits": {},
                "branches": {},
                "tags": {},
            }
            files = {".gitattributes": self.fake.file_entry(GITATTRIBUTES, lfs=False)}
            state["branches"]["main"] = self.fake.new_commit(state, None, files, "initial commit")
            self.fake.save_repo(rtype, repo_id, state)
        self._json(200, {"url": url, "name": repo_id, "id": repo_id})
        return True

    def _is_lfs(self, path: str, size: int, sample: bytes) -> bool:
        return path.endswith(LFS_SUFFIXES) or size >= self.fake.lfs_min_size or b"\0" in sample

    def preupload(self, rtype: str, repo_id: str, rev: str) -> bool:
        self._require_auth()
        payload = json.loads(self._payload)
        head, files = self.fake.commit_files(rtype, repo_id, rev)
        out = []
        for f in payload["files"]:
            lfs = self._is_lfs(f["path"], f["size"], base64.b64decode(f.get("sample", "")))
            item: dict[str, Any] = {"path": f["path"], "uploadMode": "lfs" if lfs else "regular"}
            item["shouldIgnore"] = False
            existing = files.get(f["path"])
            if existing is not None and existing["lfs"] == lfs:
                item["oid"] = existing["sha256"] if lfs else existing["oid"]
            out.append(item)
        self._json(200, {"files": out, "commitOid": head})
        return True

    def lfs_batch(self, rtype: str, repo_id: str) -> bool:
        self._require_auth()
        self.fake.load_repo(rtype, repo_id)
        payload = json.loads(self._payload)
        if payload.get("operation") != "upload":
            raise HubError(400, "fakehub only serves LFS uploads (downloads go through /resolve)")
        objects = []
        for obj in payload["objects"]:
            item: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"]}
            if not self.fake.has_object(obj["oid"]):
                item["actions"] = {"upload": {"href": f"{self.fake.endpoint}/_fake_lfs/{obj['oid']}"}}
            objects.append(item)
        self._json(
            200, {"transfer": "basic", "objects": objects}, {"Content-Type": "application/vnd.git-lfs+json"}
        )
        return True

    def lfs_put(self, oid: str) -> bool:
        # like a pre-signed storage URL: no Authorization header is sent here
        if hashlib.sha256(self._payload).hexdigest() != oid:
            raise HubError(400, "uploaded content does not match its sha256")
        self.fake.put_object(self._payload)
        self._send(200, b"", {"Content-Type": "text/plain"})
        return True

    def commit(self, rtype: str, repo_id: str, rev: str) -> bool:
        self._require_auth()
        if self._query.get("create_pr"):
            raise HubError(400, "fakehub does not support pull requests")
        lines = [json.loads(line) for line in self._payload.decode().splitlines() if line.strip()]
        fake = self.fake
        with fake.lock:
            state = fake.load_repo(rtype, repo_id)
            if rev not in state["branches"]:
                raise HubError(404, f"Branch {rev} not found (commits go to branches)", "RevisionNotFound")
            head = state["branches"][rev]
            files = dict(state["commits"][head]["files"])
            summary, description = "", ""
            for line in lines:
                key, value = line["key"], line["value"]
                if key == "header":
                    summary, description = value.get("summary", ""), value.get("description", "")
                    parent = value.get("parentCommit")
                    if parent and not head.startswith(parent):
                        raise HubError(412, f"parent commit {parent} is not the head of {rev} ({head})")
                elif key == "file":
                    if value.get("encoding") != "base64":
                        raise HubError(400, "fakehub expects base64 file content")
                    files[value["path"]] = fake.file_entry(base64.b64decode(value["content"]), lfs=False)
                elif key == "lfsFile":
                    if not fake.has_object(value["oid"]):
                        raise HubError(
                            422, f"LFS object {value['oid']} of {value['path']} was never uploaded"
                        )
                    size = len(fake.get_object(value["oid"]))
                    files[value["path"]] = {
                        "sha256": value["oid"],
                        "size": size,
                        "lfs": True,
                        "oid": git_blob_oid(lfs_pointer(value["oid"], size)),
                    }
                elif key == "deletedFile":
                    if files.pop(value["path"], None) is None:
                        raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                elif key == "deletedFolder":
                    folder = value["path"].rstrip("/") + "/"
                    for p in [p for p in files if p.startswith(folder)]:
                        del files[p]
                else:
                    raise HubError(400, f"fakehub: unknown commit operation {key}")
            if not summary:
                raise HubError(400, "commit summary is required")
            oid = fake.new_commit(state, head, files, summary, description)
            state["branches"][rev] = oid
            fake.save_repo(rtype, repo_id, state)
        url = f"{fake.endpoint}/{TYPE_PREFIX[rtype]}{repo_id}/commit/{oid}"
        self._json(200, {"success": True, "commitOid": oid, "commitUrl": url, "pullRequestUrl": None})
        return True

    def create_tag(self, rtype: str, repo_id: str, rev: str) -> bool:
        self._require_auth()
        tag = json.loads(self._payload)["tag"]
        with self.fake.lock:
            state = self.fake.load_repo(rtype, repo_id)
            oid = self.fake.resolve(state, rev)
            if tag in state["tags"]:
                raise HubError(409, f"Tag {tag} already exists")
            state["tags"][tag] = oid
            self.fake.save_repo(rtype, repo_id, state)
        self._json(200, {})
        return True

    def create_branch(self, rtype: str, repo_id: str, branch: str) -> bool:
        self._require_auth()
        payload = json.loads(self._payload or b"{}")
        with self.fake.lock:
            state = self.fake.load_repo(rtype, repo_id)
            if branch in state["branches"]:
                raise HubError(409, f"Branch {branch} already exists")
            state["branches"][branch] = self.fake.resolve(state, payload.get("startingPoint") or "main")
            self.fake.save_repo(rtype, repo_id, state)
        self._json(200, {})
        return True

    def delete_ref(self, rtype: str, repo_id: str, table: str, name: str) -> bool:
        self._require_auth()
        with self.fake.lock:
            state = self.fake.load_repo(rtype, repo_id)
            if state[table].pop(name, None) is None:
                raise HubError(404, f"{name} not found", "RevisionNotFound")
            self.fake.save_repo(rtype, repo_id, state)
        self._json(200, {})
        return True

    # ---------------------------------------------------------------- read endpoints
    def _readable_state(self, rtype: str, repo_id: str) -> dict[str, Any]:
        state = self.fake.load_repo(rtype, repo_id)
        if state["private"] and not self._authorized():
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return state

    def repo_info(self, rtype: str, repo_id: str, rev: str) -> bool:
        state = self._readable_state(rtype, repo_id)
        oid = self.fake.resolve(state, rev)
        self._json(200, self.fake.repo_json(rtype, repo_id, state, oid))
        return True

    def tree(self, rtype: str, repo_id: str, rev: str, path: str) -> bool:
        state = self._readable_state(rtype, repo_id)
        oid = self.fake.resolve(state, rev)
        recursive = self._query.get("recursive", ["false"])[0].lower() in ("1", "true")
        expand = self._query.get("expand", ["false"])[0].lower() in ("1", "true")
        files = state["commits"][oid]["files"]
        self._json(200, self.fake.tree_entries(state, oid, files, path, recursive, expand))
        return True

    def paths_info(self, rtype: str, repo_id: str, rev: str) -> bool:
        state = self._readable_state(rtype, repo_id)
        oid = self.fake.resolve(state, rev)
        files = state["commits"][oid]["files"]
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            form = json.loads(self._payload)
            paths, expand = form.get("paths", []), bool(form.get("expand"))
        else:
            form = parse_qs(self._payload.decode())
            paths = form.get("paths", [])
            expand = form.get("expand", ["false"])[0].lower() in ("1", "true")
        out = []
        for path in paths:
            path = path.strip("/")
            if path in files:
                item = self.fake.file_json(path, files[path])
            elif any(p.startswith(path + "/") for p in files):
                item = self.fake.folder_entry(files, path)
            else:
                continue
            if expand:
                item["lastCommit"] = self.fake.last_commit(state, oid, path)
            out.append(item)
        self._json(200, out)
        return True

    def resolve_file(self, rtype: str, repo_id: str, rev: str, path: str) -> bool:
        state = self._readable_state(rtype, repo_id)
        oid = self.fake.resolve(state, rev)
        entry = state["commits"][oid]["files"].get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"commit": oid})
        data = self.fake.get_object(entry["sha256"])
        etag = entry["sha256"] if entry["lfs"] else entry["oid"]
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "ETag": f'"{etag}"',
            "X-Repo-Commit": oid,
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}",
        }
        if entry["lfs"]:
            headers["X-Linked-Etag"] = f'"{entry["sha256"]}"'
            headers["X-Linked-Size"] = str(entry["size"])
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if not m or (not m.group(1) and not m.group(2)):
                raise HubError(416, f"bad range {rng}")
            size = len(data)
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start, end = max(0, size - int(m.group(2))), size - 1
            if start >= size or start > end:
                headers["Content-Range"] = f"bytes */{size}"
                self._send(416, b"", headers)
                return True
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            self._send(206, data[start : end + 1], headers)
            return True
        self._send(200, data, headers)
        return True


def client_env(hub: FakeHub, home: Path, token: str) -> dict[str, str]:
    """Environment for a child process whose ``huggingface_hub`` / ``datasets`` talk to ``hub``.

    Both libraries read these variables once, at import, so the Hub path runs in a subprocess: the
    endpoint, no Xet, the token, a private HF home (its hub and datasets caches spelled out), online,
    quiet, and the repository on the import path so the child can import ``tests``.
    """
    import os

    return {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_DISABLE_XET": "1",
        "HF_TOKEN": token,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_DATASETS_CACHE": str(home / "datasets"),
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }


def find_in_tree(root: Path, needle: bytes) -> list[Path]:
    """Every file under ``root`` whose bytes contain ``needle`` (symlinks followed)."""
    return [p for p in sorted(Path(root).rglob("*")) if p.is_file() and needle in p.read_bytes()]


if __name__ == "__main__":  # manual use: python -m tests.fakehub ROOT [TOKEN]; then HF_ENDPOINT=<printed URL>
    import sys
    import time

    with FakeHub(Path(sys.argv[1]), token=sys.argv[2] if len(sys.argv) > 2 else None) as _hub:
        print(_hub.endpoint, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
