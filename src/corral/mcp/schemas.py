"""The ``outputSchema`` of each MCP tool: what its structured content holds when the call
succeeds (a client such as the official SDK's checks answers against it). An error answer
(``isError: true``) is ``{"error": {code, message, ...facts}}`` instead (``ERROR``), which
the protocol does not check against the schema.

Standard library only: plain JSON Schema dicts. They name the fields an agent reads and
allow more (``additionalProperties``), so a field added later is not a broken answer.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["ERROR", "OUTPUT_SCHEMAS", "RUN_RESULT"]

_STR: Final = {"type": "string"}
_INT: Final = {"type": "integer"}
_NUM: Final = {"type": "number"}
_BOOL: Final = {"type": "boolean"}
_OPT_STR: Final = {"type": ["string", "null"]}
_OPT_INT: Final = {"type": ["integer", "null"]}


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": True}


#: how a command ended (``RunResult.to_dict()``), with what this server cut
RUN_RESULT: Final = _obj({
    "outcome": {"type": "string", "description": "exit, timeout, cancelled, "
                "overflow-stdout, overflow-stderr, spawn-error, memory-limit, cpu-limit, "
                "processes-limit, disk-limit"},
    "exit_code": _OPT_INT, "signal": _OPT_STR,
    "stdout": _OPT_STR, "stderr": _OPT_STR,
    "stdout_encoding": _STR, "stderr_encoding": _STR,
    "stdout_truncated": _BOOL, "stderr_truncated": _BOOL,
    "duration_ms": _NUM,
    "usage": _obj({"cpu_ms": _INT, "wall_ms": _INT, "peak_mem_mb": _INT}),
    "limit_value": _OPT_INT, "observed": _OPT_INT, "detail": _STR,
    "level": _OPT_STR,
    "notes": {"type": "array", "items": _STR,
              "description": "what the server did to the answer (output cut at its cap)"},
}, ("outcome", "exit_code", "stdout", "stderr"))

#: an error answer's structured content
ERROR: Final = _obj({"error": _obj({"code": _STR, "message": _STR}, ("code", "message")),
                     "result": RUN_RESULT}, ("error",))

_TRANSCRIPT: Final = _obj({
    "logs": {"type": "array", "items": _obj({"stream": _STR, "text": _STR})},
    "facts": {"type": "object"},
    "result": {},
    "errors": {"type": "array", "items": {"type": "object"}},
    "duration_ms": _NUM, "timed_out": _BOOL,
    "truncated": {"type": "array", "items": _STR},
    "level": _OPT_STR,
    "playground_url": _STR,
}, ("logs", "facts", "result", "errors", "timed_out"))

_PROCESS: Final = _obj({
    "name": _STR, "process": _STR, "running": _BOOL,
    "stdout": _STR, "stderr": _STR,
    "stdout_offset": _INT, "stderr_offset": _INT,
    "result": {"anyOf": [RUN_RESULT, {"type": "null"}]},
    "notes": {"type": "array", "items": _STR},
}, ("name", "process", "running"))

OUTPUT_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "run_in_sandbox": _TRANSCRIPT,
    "snippet_rules": _obj({
        "allowed_imports": {"type": "array", "items": _STR},
        "forbidden_names": {"type": "array", "items": _STR},
        "forbidden_attributes": {"type": "array", "items": _STR},
        "forbidden_attribute_prefixes": {"type": "array", "items": _STR},
        "module_members_forbidden": {"type": "object"},
        "rules": {"type": "array", "items": _STR},
    }, ("allowed_imports", "forbidden_names", "rules")),
    "run_command": RUN_RESULT,
    "sandbox_create": _obj({"name": _STR, "id": _STR, "level": _STR, "provider": _STR,
                            "idle_timeout_s": _NUM, "network": {"type": "object"}},
                           ("name", "id", "level")),
    "sandbox_exec": RUN_RESULT,
    "sandbox_write_file": _obj({"name": _STR, "path": _STR, "size": _INT},
                               ("name", "path", "size")),
    "sandbox_read_file": _obj({"name": _STR, "path": _STR, "size": _INT,
                               "encoding": {"enum": ["utf-8", "base64"]}, "content": _STR},
                              ("name", "path", "size", "encoding", "content")),
    "sandbox_list": _obj({"sandboxes": {"type": "array", "items": _STR},
                          "idle_timeout_s": _NUM}, ("sandboxes",)),
    "sandbox_destroy": _obj({"name": _STR, "destroyed": _BOOL}, ("name", "destroyed")),
    "process_start": _obj({"name": _STR, "process": _STR}, ("name", "process")),
    "process_poll": _PROCESS,
    "process_kill": _PROCESS,
    # sessions (corral.mcp.sessions): a cell's outputs; its PNGs are image content too
    "session_create": _obj({"name": _STR, "python": _STR, "level": _STR, "mem_mb": _OPT_INT},
                           ("name",)),
    "session_run": _obj({
        "cell": _INT, "ok": _BOOL, "stdout": _STR, "stderr": _STR,
        "result": {"type": ["object", "null"]}, "displays": {"type": "array"},
        "error": {"type": ["object", "null"]}, "timed_out": _BOOL, "truncated": _BOOL,
        "images": _INT}, ("cell", "ok", "stdout", "stderr")),
    "session_close": _obj({"name": _STR, "closed": _BOOL}, ("name", "closed")),
}

#: the file operations (mcp/files.py): one entry is ``FileInfo.to_dict()``
_FILE_ENTRY: Final = _obj({
    "name": _STR, "path": _STR, "type": {"enum": ["file", "dir", "symlink", "other"]},
    "size": _INT, "mode": _INT, "permissions": _STR, "modified": _NUM,
    "symlink_target": _OPT_STR}, ("name", "path", "type", "size"))
OUTPUT_SCHEMAS.update({
    "sandbox_list_files": _obj({"name": _STR, "path": _STR,
                                "entries": {"type": "array", "items": _FILE_ENTRY},
                                "truncated": _BOOL, "max_entries": _INT},
                               ("name", "path", "entries", "truncated")),
    "sandbox_file_info": _obj({"name": _STR, "path": _STR, "info": _FILE_ENTRY},
                              ("name", "path", "info")),
    "sandbox_file_exists": _obj({"name": _STR, "path": _STR, "exists": _BOOL},
                                ("name", "path", "exists")),
    "sandbox_make_dir": _obj({"name": _STR, "path": _STR, "created": _BOOL},
                             ("name", "path", "created")),
    "sandbox_remove": _obj({"name": _STR, "path": _STR, "removed": _BOOL},
                           ("name", "path", "removed")),
})

_ENV_INFO: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "state": {"enum": ["building", "ready", "failed", "missing"]},
        "owner": {"enum": ["operator", "tenant"]},
        "digest": {"type": "string"},
        "requirements": {"type": "array", "items": {"type": "string"}},
        "modules": {"type": "array", "items": {"type": "string"}},
        "size_bytes": {"type": "integer"},
        "started_at": {"type": "number"},
        "finished_at": {"type": "number"},
        "error": {"type": "object"},
    },
    "required": ["name", "state", "owner"],
}
#: environments (mcp/envs.py): an environment as environment_list and _build give it
OUTPUT_SCHEMAS.update({
    "environment_list": {"type": "object", "properties": {
        "environments": {"type": "array", "items": _ENV_INFO}}, "required": ["environments"]},
    "environment_build": _ENV_INFO,
})
