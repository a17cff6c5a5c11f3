"""The file operations over HTTP (issue 27 item 4): ``POST /v1/sandboxes/{sid}/files/list |
info | exists | mkdir | remove``, against a real server on 127.0.0.1 (context-isolated,
the subproc provider), and relayed by the remote provider (the sync ``Sandbox`` driven
through ``url``/``token``): the same typed errors as the library."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from servehelp import ALICE, BOB, Server

from corral.core.errors import ConfigInvalidError
from corral.core.filewalk import MAX_LIST_ENTRIES
from corral.sandbox import Sandbox

SPEC = {"level": "context-isolated", "network": {"kind": "unrestricted"}}


@pytest.fixture
def alice(server: Server) -> Iterator[httpx.Client]:
    with server.client(ALICE) as c:
        yield c
        for sb in c.get("/v1/sandboxes").json()["sandboxes"]:
            c.delete(f"/v1/sandboxes/{sb['id']}")


def _sid(c: httpx.Client) -> str:
    r = c.post("/v1/sandboxes", json={"spec": SPEC})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _op(c: httpx.Client, sid: str, op: str, **body: Any) -> httpx.Response:
    return c.post(f"/v1/sandboxes/{sid}/files/{op}", json=body)


def _put(c: httpx.Client, sid: str, path: str, data: bytes = b"x") -> None:
    assert c.put(f"/v1/sandboxes/{sid}/files", params={"path": path},
                 content=data).status_code == 204


def test_list_depth_info_exists_mkdir_remove(alice: httpx.Client) -> None:
    sid = _sid(alice)
    _put(alice, sid, "a/b/c.txt", b"hello")
    _put(alice, sid, "top.txt")
    r = _op(alice, sid, "list")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert [e["name"] for e in doc["entries"]] == ["a", "top.txt"]
    assert doc["truncated"] is False and doc["max_entries"] == MAX_LIST_ENTRIES
    deep = _op(alice, sid, "list", depth=3).json()["entries"]
    names = [e["path"].split("/", 2)[-1] for e in deep]
    assert [n.rsplit("/", 1)[-1] for n in names] == ["a", "b", "c.txt", "top.txt"]
    assert any(e["name"] == "c.txt" and e["size"] == 5 and e["type"] == "file"
               for e in deep)
    assert len(_op(alice, sid, "list", depth=2).json()["entries"]) == 3

    info = _op(alice, sid, "info", path="a/b/c.txt").json()
    assert info["type"] == "file" and info["size"] == 5 and info["name"] == "c.txt"
    assert info["permissions"].startswith("rw")
    assert _op(alice, sid, "exists", path="a/b").json() == {"exists": True}
    assert _op(alice, sid, "exists", path="nope").json() == {"exists": False}

    assert _op(alice, sid, "mkdir", path="m/n").json() == {"created": True}
    assert _op(alice, sid, "mkdir", path="m/n").json() == {"created": False}
    assert _op(alice, sid, "info", path="m/n").json()["type"] == "dir"

    r = _op(alice, sid, "remove", path="a")  # not empty, not recursive
    assert r.status_code == 409, r.text
    assert r.json()["error"] == {"code": "conflict", "what": "file", "errno": "ENOTEMPTY",
                                 "path": "a", "message": r.json()["error"]["message"]}
    assert _op(alice, sid, "remove", path="a", recursive=True).status_code == 204
    assert _op(alice, sid, "exists", path="a").json() == {"exists": False}


def test_truncated_past_max_entries(alice: httpx.Client) -> None:
    sid = _sid(alice)
    for i in range(5):
        _put(alice, sid, f"f{i}")
    doc = _op(alice, sid, "list", max_entries=3).json()
    assert doc["truncated"] is True and doc["max_entries"] == 3
    assert [e["name"] for e in doc["entries"]] == ["f0", "f1", "f2"]
    r = _op(alice, sid, "list", max_entries=MAX_LIST_ENTRIES + 1)
    assert r.status_code == 400 and r.json()["error"]["field"] == "max_entries"


def test_typed_refusals(alice: httpx.Client, server: Server) -> None:
    sid = _sid(alice)
    _put(alice, sid, "file.txt")
    for op, body in (("list", {"path": "missing"}), ("info", {"path": "missing"}),
                     ("remove", {"path": "missing"}),
                     ("mkdir", {"path": "x/y", "parents": False})):
        r = _op(alice, sid, op, **body)
        assert r.status_code == 404, (op, r.text)
        assert r.json()["error"]["code"] == "not-found"
        assert r.json()["error"]["what"] == "file"
    for op in ("list", "info", "exists", "mkdir", "remove"):
        r = _op(alice, sid, op, path="../../etc")  # outside /work
        assert r.status_code == 400, (op, r.text)
        assert r.json()["error"]["code"] == "config-invalid"
    r = _op(alice, sid, "list", path="file.txt")
    assert r.status_code == 409 and r.json()["error"]["errno"] == "ENOTDIR"
    r = _op(alice, sid, "mkdir", path="file.txt")
    assert r.status_code == 409 and r.json()["error"]["errno"] == "EEXIST"
    r = _op(alice, sid, "list", depth="2")  # a wrong type, an unknown key
    assert r.status_code == 400 and r.json()["error"]["field"] == "depth"
    r = _op(alice, sid, "remove", path="file.txt", recurse=True)
    assert r.status_code == 400 and r.json()["error"]["code"] == "config-invalid"
    assert _op(alice, sid, "remove", path="").status_code == 400  # never the work dir
    assert _op(alice, "no-such-sandbox-id-0000", "list").status_code == 404
    with server.client(BOB) as bob:  # another tenant's sandbox is unknown
        r = _op(bob, sid, "info", path="file.txt")
        assert r.status_code == 404 and r.json()["error"]["what"] == "sandbox"
    with server.client(None) as anon:
        assert _op(anon, sid, "list").status_code == 401


def test_remote_provider_relays_them(server: Server) -> None:
    with Sandbox.create(level="context-isolated", url=server.url, token=ALICE) as sb:
        sb.files.write("d/e/f.txt", "hi")
        sb.files.write("g.txt", "g")
        assert [f.name for f in sb.files.list()] == ["d", "g.txt"]
        deep = sb.files.list("", depth=3)
        assert [f.name for f in deep] == ["d", "e", "f.txt", "g.txt"]
        assert sb.files.get_info("d/e/f.txt").size == 2
        assert sb.files.exists("d/e") and not sb.files.exists("nope")
        assert sb.files.make_dir("new/dir") is True
        assert sb.files.make_dir("new/dir") is False
        with pytest.raises(FileNotFoundError):
            sb.files.get_info("nope")
        with pytest.raises(OSError, match="not empty") as ei:
            sb.files.remove("d")
        assert ei.value.errno == errno.ENOTEMPTY
        with pytest.raises(NotADirectoryError):
            sb.files.list("g.txt")
        with pytest.raises(FileExistsError):
            sb.files.make_dir("g.txt")
        with pytest.raises(ConfigInvalidError):
            sb.files.get_info("../../etc/passwd")
        with pytest.raises(ConfigInvalidError) as ci:
            sb.files.list("", depth=3, max_entries=2)
        assert ci.value.field == "max_entries"
        sb.files.remove("d", recursive=True)
        assert not sb.files.exists("d")
