"""Publish a built dataset folder as an immutable, tagged version; fetch a published version back.

Two targets share one layout (README.md with a ``configs:`` block, ``data/<config>/*.parquet`` and
``manifest.json``):

- the Hugging Face Hub (or any server speaking its API): every file goes into ONE commit on ``main``
  (``HfApi.create_commit``), and the version is a git tag on that commit, so ``load_dataset(repo, config,
  revision="v1.2.0")`` reads exactly the bytes that were published;
- a local directory tree ``ROOT/<org>/<name>/<version>/`` that ``load_dataset(PATH, config)`` reads
  offline.

Image files of VQA suites (``images/<sha256>.<ext>``) are listed in the manifest, so they are uploaded,
copied, fetched and re-hashed with everything else.  A row's ``image`` is a path relative to the
dataset root: :func:`image_path` resolves it in a local or fetched folder; from the Hub,
``hf_hub_download(repo_id, row["image"], repo_type="dataset", revision=version)`` gets one file.

A version is immutable: publishing different bytes under an existing version is refused, publishing the
same bytes again is a no-op.  The folder is re-hashed against its manifest before anything is sent, and
a fetched version is re-hashed after download (offline mode can hand back a cached *other* revision).

``huggingface_hub`` is imported lazily, so callers can set ``HF_ENDPOINT`` / ``HF_HUB_OFFLINE`` /
``HF_HUB_DISABLE_XET`` (read once, at its import) before the first call.  The token is taken from the
argument or ``HF_TOKEN`` and passed to the client only; it is never logged, stored or returned.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from equipoise.builders.dataset_writer import MANIFEST, MANIFEST_DIGEST, sha256_file, verify_dataset

REPO_TYPE = "dataset"
SEMVER_RE = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# files the Hub adds by itself; never part of a version's content
HUB_OWN_FILES = frozenset({".gitattributes"})
# images are stored once per dataset, named by their content; an item's ``image`` is that path
IMAGE_DIR = "images"
IMAGE_RE = re.compile(r"^images/([0-9a-f]{64})\.(png|jpg|gif|bmp|webp)$")
EXTERNAL_IMAGE = ("http://", "https://", "data:")  # image values that are not files of the dataset


class PublishError(RuntimeError):
    """A dataset version could not be published or fetched."""


class IntegrityError(PublishError):
    """Files do not match their manifest (tampered, truncated or a wrong revision)."""

    def __init__(self, message: str, problems: list[str]):
        super().__init__(message + "\n  " + "\n  ".join(problems))
        self.problems = problems


class VersionExistsError(PublishError):
    """The version is already published with different content (versions are immutable)."""


class PublishResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target: Literal["hub", "local"]
    repo_id: str
    version: str
    commit_oid: str | None  # the tagged commit (hub); None for a local target
    url: str  # browsable URL of the tagged tree (hub) or file:// URI of the version directory
    path: str | None = None  # the version directory (local target)
    files: list[str]  # every file of the version, sorted
    manifest_sha256: str
    created: bool  # False: the identical version was already there, nothing was written


# ---------------------------------------------------------------------------- validation
def validate_version(version: str) -> str:
    if not SEMVER_RE.fullmatch(version):
        raise PublishError(f"version must look like vMAJOR.MINOR.PATCH (e.g. v1.0.0), got {version!r}")
    return version


def validate_repo_id(repo_id: str) -> str:
    if not REPO_ID_RE.fullmatch(repo_id) or ".." in repo_id or repo_id.endswith((".git", ".")):
        raise PublishError(f"repo id must look like ORG/NAME, got {repo_id!r}")
    return repo_id


def _safe_rel(rel: str) -> str:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or "\\" in rel:
        raise PublishError(f"manifest lists an unsafe path: {rel!r}")
    return rel


def dataset_files(folder: Path) -> list[str]:
    """The files of a version: everything the manifest lists plus the manifest, after re-hashing them."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PublishError(f"{folder}: not a directory")
    problems = verify_dataset(folder)
    if problems:
        raise IntegrityError(f"{folder}: refusing to publish, files do not match manifest.json", problems)
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    files = sorted({_safe_rel(r) for r in manifest.get("files", {})} | {MANIFEST, MANIFEST_DIGEST})
    if "README.md" not in files:
        raise PublishError(f"{folder}: manifest.json does not list README.md (the card with `configs:`)")
    return files


def _git_blob_oid(path: Path) -> str:
    h = hashlib.sha1()
    h.update(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------- hub target
def _token(token: str | None) -> str | None:
    return token or os.environ.get("HF_TOKEN") or None


def _remote_tree(api: Any, repo_id: str, revision: str) -> dict[str, tuple[str, str]]:
    """path -> ('sha256', hex) for LFS files, ('git', blob oid) for regular files, at ``revision``."""
    from huggingface_hub.hf_api import RepoFile

    out: dict[str, tuple[str, str]] = {}
    for entry in api.list_repo_tree(repo_id, revision=revision, recursive=True, repo_type=REPO_TYPE):
        if isinstance(entry, RepoFile) and entry.path not in HUB_OWN_FILES:
            out[entry.path] = ("sha256", entry.lfs.sha256) if entry.lfs else ("git", entry.blob_id)
    return out


def _local_digests(folder: Path, files: list[str]) -> dict[str, dict[str, str]]:
    """Both digests the Hub may report per file (sha256 for LFS files, git blob oid for regular ones),
    taken right after verification so later comparisons are against the verified bytes."""
    return {r: {"sha256": sha256_file(folder / r), "git": _git_blob_oid(folder / r)} for r in files}


def _tree_differences(local: dict[str, dict[str, str]], remote: dict[str, tuple[str, str]]) -> list[str]:
    diffs = [f"{p}: only in the published version" for p in sorted(set(remote) - set(local))]
    for rel, digests in sorted(local.items()):
        if rel not in remote:
            diffs.append(f"{rel}: not in the published version")
        elif digests[remote[rel][0]] != remote[rel][1]:
            diffs.append(f"{rel}: content differs")
    return diffs


def hub_url(endpoint: str, repo_id: str, version: str) -> str:
    return f"{endpoint.rstrip('/')}/datasets/{repo_id}/tree/{version}"


def publish_to_hub(
    folder: Path,
    repo_id: str,
    version: str,
    *,
    token: str | None = None,
    endpoint: str | None = None,
    private: bool = False,
    commit_message: str | None = None,
) -> PublishResult:
    """Upload the folder as one commit on ``main`` and tag it ``version``.

    Refuses a folder that does not match its manifest, a malformed version, and a version that is
    already tagged with different content; an identical re-publish returns ``created=False``.
    """
    folder = Path(folder)
    validate_repo_id(repo_id)
    validate_version(version)
    files = dataset_files(folder)
    local = _local_digests(folder, files)
    manifest_sha = local[MANIFEST]["sha256"]

    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint, token=_token(token))
    base = api.endpoint

    def result(oid: str, created: bool) -> PublishResult:
        return PublishResult(
            target="hub",
            repo_id=repo_id,
            version=version,
            commit_oid=oid,
            url=hub_url(base, repo_id, version),
            files=files,
            manifest_sha256=manifest_sha,
            created=created,
        )

    def existing_tag() -> str | None:
        refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
        return next((t.target_commit for t in refs.tags if t.name == version), None)

    def check_same(oid: str) -> None:
        diffs = _tree_differences(local, _remote_tree(api, repo_id, oid))
        if diffs:
            raise VersionExistsError(
                f"{repo_id}@{version} is already published (commit {oid}) with different content; "
                "versions are immutable, publish a new version instead:\n  " + "\n  ".join(diffs)
            )

    api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
    tagged = existing_tag()
    if tagged is not None:
        check_same(tagged)
        return result(tagged, created=False)

    refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
    head = next((b.target_commit for b in refs.branches if b.name == "main"), None)
    stale = sorted(set(_remote_tree(api, repo_id, head)) - set(files)) if head else []
    operations: list[Any] = [
        CommitOperationAdd(path_in_repo=r, path_or_fileobj=str(folder / r)) for r in files
    ]
    operations += [CommitOperationDelete(path_in_repo=r) for r in stale]
    commit = api.create_commit(
        repo_id,
        operations,
        commit_message=commit_message or f"Publish {version}",
        commit_description=f"manifest.json sha256 {manifest_sha}",
        repo_type=REPO_TYPE,
        revision="main",
        parent_commit=head,  # fail instead of mixing with a concurrent push
    )
    oid = commit.oid
    try:
        api.create_tag(
            repo_id, tag=version, revision=oid, repo_type=REPO_TYPE, tag_message=f"Publish {version}"
        )
    except HfHubHTTPError as err:
        if err.response is None or err.response.status_code != 409:
            raise
        # tagged concurrently: fine only if it is the same content
        tagged = existing_tag()
        if tagged is None:
            raise
        check_same(tagged)
        return result(tagged, created=False)
    # the tag must resolve to exactly the verified bytes (also catches a file changed during the upload)
    diffs = _tree_differences(local, _remote_tree(api, repo_id, version))
    if diffs:
        raise IntegrityError(f"{repo_id}@{version}: published tree differs from {folder}", diffs)
    return result(oid, created=True)


# ---------------------------------------------------------------------------- local target
def local_version_dir(root: Path, repo_id: str, version: str) -> Path:
    org, name = validate_repo_id(repo_id).split("/")
    return Path(root) / org / name / validate_version(version)


def _same_local(src: Path, files: list[str], dest: Path) -> list[str]:
    there = sorted(str(p.relative_to(dest).as_posix()) for p in dest.rglob("*") if p.is_file())
    diffs = [f"{p}: only in the published version" for p in sorted(set(there) - set(files))]
    for rel in files:
        if rel not in there:
            diffs.append(f"{rel}: not in the published version")
        elif sha256_file(src / rel) != sha256_file(dest / rel):
            diffs.append(f"{rel}: content differs")
    return diffs


def publish_to_local(folder: Path, root: Path, repo_id: str, version: str) -> PublishResult:
    """Copy the folder byte-for-byte to ``root/<org>/<name>/<version>/`` (atomically, via a rename)."""
    folder = Path(folder)
    dest = local_version_dir(root, repo_id, version)
    files = dataset_files(folder)
    manifest_sha = sha256_file(folder / MANIFEST)

    def result(created: bool) -> PublishResult:
        return PublishResult(
            target="local",
            repo_id=repo_id,
            version=version,
            commit_oid=None,
            url=dest.resolve().as_uri(),
            path=str(dest),
            files=files,
            manifest_sha256=manifest_sha,
            created=created,
        )

    def check_same() -> PublishResult:
        diffs = _same_local(folder, files, dest)
        if diffs:
            raise VersionExistsError(
                f"{dest} already holds {repo_id}@{version} with different content; "
                "versions are immutable, publish a new version instead:\n  " + "\n  ".join(diffs)
            )
        return result(created=False)

    if dest.exists():
        return check_same()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".staging-{version}-{uuid.uuid4().hex}"
    try:
        for rel in files:
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / rel, target)
        problems = verify_dataset(staging)
        if problems:
            raise IntegrityError(f"{folder}: files changed while being copied", problems)
        try:
            staging.rename(dest)
        except OSError:
            if dest.exists():  # published concurrently
                return check_same()
            raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return result(created=True)


# ---------------------------------------------------------------------------- fetch
def parse_ref(ref: str) -> tuple[str, str | None]:
    """``ORG/NAME[@REV]`` -> (repo_id, revision or None)."""
    repo_id, _, rev = ref.partition("@")
    return validate_repo_id(repo_id), (rev or None)


def fetch_published(
    ref: str,
    *,
    cache_dir: Path | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    local_files_only: bool = False,
    verify: bool = True,
) -> Path:
    """Resolve ``DIR``, ``DIR@VERSION`` (a local publish root) or ``ORG/NAME[@REV]`` to a dataset folder.

    A Hub reference is downloaded with ``snapshot_download`` (repo type dataset) into ``cache_dir`` (default:
    the huggingface_hub cache).  With ``verify`` every file listed in the manifest is re-hashed and an
    :class:`IntegrityError` is raised on any mismatch.
    """
    path = Path(ref).expanduser()
    folder: Path | None = None
    hub = False
    if path.is_dir():
        folder = path
    elif "@" in ref:
        base, _, rev = ref.rpartition("@")
        if rev and Path(base).expanduser().is_dir() and (Path(base).expanduser() / rev).is_dir():
            folder = Path(base).expanduser() / rev
    if folder is None:
        hub = True
        try:
            repo_id, rev = parse_ref(ref)
        except PublishError:
            raise PublishError(f"{ref!r} is neither a local dataset directory nor ORG/NAME[@REV]") from None
        from huggingface_hub import snapshot_download

        folder = Path(
            snapshot_download(
                repo_id,
                repo_type=REPO_TYPE,
                revision=rev,
                cache_dir=str(cache_dir) if cache_dir is not None else None,
                token=_token(token),
                endpoint=endpoint,
                local_files_only=local_files_only,
            )
        )
        if rev is not None and COMMIT_RE.fullmatch(rev) and folder.name != rev:
            raise IntegrityError(f"{ref}: got snapshot {folder.name}", [f"expected commit {rev}"])
    if verify:
        problems = verify_dataset(folder)
        if problems:
            message = f"{ref}: dataset files do not match manifest.json ({folder})"
            if hub and (local_files_only or _hub_offline()):
                message += (
                    "; offline, the cache can hold a partial snapshot (load_dataset fetches only the files it"
                    " needs) or another revision: fetch this version once online"
                )
            raise IntegrityError(message, problems)
    return folder


def load_config(folder: Path, config: str, split: str = "test", *, cache_dir: Path | None = None) -> Any:
    """``datasets.load_dataset(folder, config, split=split)`` with a content-addressed cache.

    datasets 5.2 keys the cache of a local folder by its *basename*, config and a hash that depends on
    neither the absolute path nor the file contents, so two different ``.../v1.0.0`` folders (two repos,
    two roots, a rebuilt folder) share one cache entry and the second load silently returns the first
    one's rows.  Caching under the manifest's sha256 (which covers every file) avoids that.  The folder
    is verified against its manifest first.
    """
    import datasets

    folder = Path(folder)
    problems = verify_dataset(folder)
    if problems:
        raise IntegrityError(f"{folder}: dataset files do not match manifest.json", problems)
    root = Path(cache_dir) if cache_dir is not None else Path(datasets.config.HF_DATASETS_CACHE)
    digest = sha256_file(folder / MANIFEST)[:16]
    return datasets.load_dataset(
        str(folder), config, split=split, cache_dir=str(root / f"equipoise-{digest}")
    )


def image_path(folder: Path, image: str, *, verify: bool = True) -> Path:
    """The file a row's ``image`` names inside a dataset folder (a build, a local publish or a fetched
    snapshot), checked to be a file the manifest lists; with ``verify`` its sha256 is re-checked too.

    Why not ``folder / image`` directly: the column is data, so a path leaving the folder is refused,
    and a missing or altered image fails here, by name, instead of later inside a model backend.
    """
    folder = Path(folder)
    if image.startswith(EXTERNAL_IMAGE):
        raise PublishError(f"{image[:40]!r}...: an external image (URL or data URI), not a dataset file")
    try:
        rel = _safe_rel(image)
    except PublishError:
        raise PublishError(f"{image!r}: not a path inside the dataset") from None
    try:
        listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("files", {})
    except (OSError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"{folder}: cannot read {MANIFEST}", [str(exc)]) from None
    path = folder / rel
    if rel not in listed:
        raise IntegrityError(f"{folder}: image {rel} is not listed in {MANIFEST}", [f"{path}: not listed"])
    if not path.is_file():
        raise IntegrityError(f"{folder}: image {rel} is missing", [f"{path}: missing"])
    if verify and sha256_file(path) != listed[rel]:
        raise IntegrityError(f"{folder}: image {rel} does not match {MANIFEST}", [f"{path}: sha256 mismatch"])
    return path


def open_image(folder: Path, image: str) -> Any:
    """``PIL.Image.open`` of :func:`image_path` (Pillow is imported here only; it is an optional
    dependency, installed with the ``vllm`` extra)."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("open_image needs Pillow: pip install pillow") from exc
    return Image.open(image_path(folder, image))


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)
