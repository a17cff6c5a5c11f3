"""``corral serve``'s file operations beside read and write (issue 27 item 4): list (``depth``
levels deep, bounded), info (stat), exists, make a directory, remove.

Each is ``POST /v1/sandboxes/{sid}/files/<op>`` with a JSON body (a typed shape: unknown
keys and wrong types are refused with 400 naming the field, as every body of the API).
The tenant's auth, its sandboxes and the edge's caps apply as for every route (they are
routes of :data:`corral.serve.app.ROUTES`, handled by :class:`FileRoutes`, a base of the
app's handler class). The paths are the contract's: relative to the work dir or absolute
under it; one that leaves the sandbox's files is ``400 config-invalid``; nothing at the
path is ``404 not-found`` with ``what: "file"`` (as a read); what else the file system
answers (a directory that is not empty, a file where a directory is wanted) is
``409 conflict`` with ``what: "file"``, the ``errno`` name (``ENOTEMPTY``, ``ENOTDIR``,
``EEXIST``, ``EISDIR``) and the ``path``: the remote provider rebuilds the builtin
``OSError`` subclass from it.

A listing returns at most ``max_entries`` entries (default and ceiling
:data:`~corral.core.filewalk.MAX_LIST_ENTRIES`); a bigger tree answers the first ones,
sorted by path, with ``truncated: true``.
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Awaitable
from typing import Annotated, Any, Final, TypeAlias, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from corral.core.filewalk import MAX_LIST_DEPTH, MAX_LIST_ENTRIES, list_tree
from corral.serve.models import operation
from corral.serve.service import ApiError, Service
from corral.serve.state import TenantState

__all__ = ["BODY_NAMED", "FILE_ROUTES", "FileRoutes", "oserror_of"]

T = TypeVar("T")


class _In(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A request shape: unknown fields are refused."""


class _Out(msgspec.Struct, omit_defaults=True):
    """An answer's shape (for the document)."""


Path_: TypeAlias = Annotated[str, msgspec.Meta(
    max_length=4096, description="relative to the sandbox's work dir, or absolute under it")]
Named: TypeAlias = Annotated[str, msgspec.Meta(min_length=1, max_length=4096, description=(
    "relative to the sandbox's work dir, or absolute under it (not the work dir itself)"))]


class ListFilesRequest(_In):
    """The entries under ``path`` (default the work dir) down to ``depth`` levels."""

    path: Path_ = ""
    depth: Annotated[int, msgspec.Meta(ge=1, le=MAX_LIST_DEPTH)] = 1
    max_entries: Annotated[int, msgspec.Meta(ge=1, le=MAX_LIST_ENTRIES)] = MAX_LIST_ENTRIES


class PathRequest(_In):
    """One path of the sandbox's files (default the work dir)."""

    path: Path_ = ""


class MakeDirRequest(_In):
    """A directory to make (``parents``: the missing ones above it too)."""

    path: Named
    parents: bool = True


class RemoveRequest(_In):
    """A file, symlink or directory to remove (a directory not empty needs
    ``recursive``)."""

    path: Named
    recursive: bool = False


class FileEntry(_Out):
    """One entry (``FileInfo.to_dict()``): a symlink is never followed."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    permissions: str
    modified: float
    symlink_target: str | None = None


class FileListing(_Out):
    entries: list[FileEntry]
    truncated: bool
    max_entries: int


class Exists(_Out):
    exists: bool


class Made(_Out):
    created: bool


#: (method, path tail under /v1/sandboxes/{sid}, handler, needs a tenant)
FILE_ROUTES: Final[tuple[tuple[str, str, str, bool], ...]] = (
    ("POST", "/files/list", "list_files", True),
    ("POST", "/files/info", "file_info", True),
    ("POST", "/files/exists", "file_exists", True),
    ("POST", "/files/mkdir", "make_dir", True),
    ("POST", "/files/remove", "remove_file", True),
)


#: the operations whose object (a file's path) is in the JSON body: the OpenAPI document
#: gives them no link from a create (a link fills path parameters only; a file a fresh
#: sandbox lacks is a 404 a fuzzer following links would take for a lost sandbox)
BODY_NAMED: Final = frozenset(name for _m, _t, name, _n in FILE_ROUTES)


def oserror_of(err: OSError, path: str) -> ApiError:
    """What the file system answered, as the API's ``409 conflict``."""
    name = _errno.errorcode.get(err.errno or 0, "EIO")
    return ApiError("conflict", f"{path!r}: {err.strerror or name}", what="file",
                    errno=name, path=path)


def _json(doc: Any) -> Response:
    return Response(msgspec.json.encode(doc), media_type="application/json")


class FileRoutes:
    """The file-operation handlers of the app's handler class."""

    s: Service

    async def _files_op(self, request: Request, tenant: TenantState, path: str,
                        work: Any) -> Any:
        entry = self.s.entry(tenant, request.path_params["sid"])
        with entry.in_use():
            try:
                got: Awaitable[Any] = work(entry.sandbox)
                return await got
            except FileNotFoundError as e:
                raise ApiError("not-found", f"no such file: {e.filename or path!r}",
                               what="file", path=path) from None
            except OSError as e:
                raise oserror_of(e, path) from None

    @operation("the entries under a directory, depth levels deep, sorted by path (a "
               "symlink is an entry, never walked into); past max_entries the first ones "
               "with truncated: true", body=ListFilesRequest, ok=FileListing,
               errors=(409,), tag="files")
    async def list_files(self, request: Request, tenant: TenantState,
                         body: ListFilesRequest) -> Response:
        entries, cut = await self._files_op(
            request, tenant, body.path,
            lambda sb: list_tree(sb, body.path, body.depth, body.max_entries))
        return _json({"entries": [e.to_dict() for e in entries], "truncated": cut,
                      "max_entries": body.max_entries})

    @operation("what is at a path (a symlink itself, not where it points)",
               body=PathRequest, ok=FileEntry, errors=(409,), tag="files")
    async def file_info(self, request: Request, tenant: TenantState, body: PathRequest
                        ) -> Response:
        info = await self._files_op(request, tenant, body.path,
                                    lambda sb: sb.get_info(body.path))
        return _json(info.to_dict())

    @operation("whether anything (a dangling symlink too) is at a path", body=PathRequest,
               ok=Exists, errors=(409,), tag="files")
    async def file_exists(self, request: Request, tenant: TenantState, body: PathRequest
                          ) -> Response:
        found = await self._files_op(request, tenant, body.path,
                                     lambda sb: sb.exists(body.path))
        return _json({"exists": bool(found)})

    @operation("make a directory: created false when one was there", body=MakeDirRequest,
               ok=Made, errors=(409,), tag="files")
    async def make_dir(self, request: Request, tenant: TenantState, body: MakeDirRequest
                       ) -> Response:
        made = await self._files_op(request, tenant, body.path,
                                    lambda sb: sb.make_dir(body.path, parents=body.parents))
        return _json({"created": bool(made)})

    @operation("remove a file, symlink or directory (not empty: recursive)",
               body=RemoveRequest, status=204, errors=(409,), tag="files")
    async def remove_file(self, request: Request, tenant: TenantState, body: RemoveRequest
                          ) -> Response:
        await self._files_op(request, tenant, body.path,
                             lambda sb: sb.remove(body.path, recursive=body.recursive))
        return Response(status_code=204)
