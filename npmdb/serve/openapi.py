"""The OpenAPI 3.1 description of the JSON API (written by hand, served at /openapi.json)."""

from __future__ import annotations

from typing import Any

from npmdb.query.spec import MAX_LEN, RANGES

from .settings import MAX_OFFSET, Settings

__all__ = ["schema"]


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_body(name: str) -> dict:
    return {"required": True, "content": {"application/json": {"schema": _ref(name)}}}


def _ok(name: str, description: str = "OK") -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


ERRORS = {"400": _ok("Error", "bad request, bad query (ProgrammingError) or over a limit "
                              "(LimitExceeded, with the limit)"),
          "401": _ok("Error", "missing or wrong access token"),
          "405": _ok("Error", "method not allowed on this path (the Allow header lists "
                              "those that are)"),
          "409": _ok("Error", "a conflict: IntegrityError (a write) or OperationalError "
                              "(the database is busy: retry)"),
          "413": _ok("Error", "request body or query too large"),
          "500": _ok("Error", "internal error (details in the server log)"),
          "503": _ok("Error", "over the per-request time limit")}
NOT_FOUND = {"404": _ok("Error", "no such document or tag (NotFound)")}


def _range(name: str) -> dict[str, float]:
    lo, hi = RANGES[name]
    return {"minimum": lo, "maximum": hi}


def schema(settings: Settings) -> dict[str, Any]:
    s = settings
    version_param = {"name": "version", "in": "query", "required": False,
                     "schema": {"type": ["integer", "string"]}, "description": "id or tag"}
    options = {
        "top": {"type": "integer", "minimum": 1, "maximum": s.max_top, "default": 5},
        "k": {"type": "integer", "minimum": 1, "maximum": s.max_k, "default": 1024},
        "mode": {"enum": ["phrase", "token"], "default": "phrase"},
        "blocks": {"type": "integer", "minimum": 1, "maximum": s.max_blocks, "default": 3},
        "max_len": {"type": "integer", "minimum": 1, "maximum": MAX_LEN, "default": 10},
        "tau": {"type": "number", **_range("tau"), "default": 1.0},
        "alpha": {"type": "number", **_range("alpha"), "default": 0.0},
        "exact": {"type": "boolean", "default": False},
        "scoring": {"enum": ["npm", "raw"], "default": "npm"},
        "group_by": {"enum": ["phrase", "tokens", "document", "word"], "default": "phrase"},
        "clean_edges": {"type": "boolean", "default": True},
        "no_stopwords": {"type": "boolean", "default": False},
        "not_in_query": {"type": "boolean", "default": True},
        "no_query_words": {"type": "boolean", "default": True},
        "not_subject_name": {"type": "boolean", "default": True,
                             "description": "drop answers found only as names of the query's "
                                            "subject in an entry's head"},
        "whole_names": {"type": "boolean", "default": True,
                        "description": "drop answers found only as part of a longer "
                                       "capitalised name"},
        "bm25_title": {"type": "boolean", "default": True},
        "bm25_question": {"type": "boolean", "default": False},
        "bm25_prior": {"type": "number", "default": 0.5, **_range("bm25_prior"),
                       "description": "weight of each BM25 block's text score in the span "
                                      "scores (0: NPM's scores)"},
        "evidence": {"type": "integer", "minimum": 0, "maximum": s.max_evidence, "default": 3,
                     "description": "occurrences kept per answer"},
        "offset": {"type": "integer", "minimum": 0, "maximum": s.max_rows, "default": 0},
        "version": {"type": ["integer", "string"], "description": "AS OF: id or tag"},
    }
    schemas = {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["type", "message"], "properties": {
                "type": {"type": "string", "examples": [
                    "ProgrammingError", "DataError", "BadRequest", "LimitExceeded", "NotFound", "ReadOnly",
                    "Unauthorized", "MethodNotAllowed", "IntegrityError", "OperationalError",
                    "PayloadTooLarge", "Timeout", "InternalError"]},
                "message": {"type": "string"},
                "line": {"type": "integer", "description": "a parse (ProgrammingError) or "
                                                            "a row's value (DataError): where in "
                                                            "the query (from 1)"},
                "column": {"type": "integer"},
                "expected": {"type": "array", "items": {"type": "string"},
                             "description": "what the parser expected there"},
                "detail": {"type": "string", "description": "the error without the query "
                                                           "and caret"},
                "limit": {"type": "integer", "description": "LimitExceeded: the limit"}}}}},
        "FillMaskRequest": {"type": "object", "required": ["query"],
                            "additionalProperties": False, "properties": {
            "query": {"type": "string", "maxLength": s.max_query}, **options,
            "retrieval": {"enum": ["bm25", "dense", "hybrid"], "default": "bm25",
                          "description": "BM25 blocks; dense when exact is true"}}},
        "ClassifyRequest": {"type": "object", "required": ["query", "labels"],
                            "additionalProperties": False, "properties": {
            "query": {"type": "string", "maxLength": s.max_query},
            "labels": {"type": "object", "additionalProperties": {
                "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}},
            "calibrate": {"type": "boolean", "default": False},
            "retrieval": {"enum": ["dense", "bm25", "hybrid"], "default": "dense"},
            **{k: v for k, v in options.items() if k not in ("top", "alpha", "scoring",
                                                             "group_by", "no_stopwords",
                                                             "not_in_query", "no_query_words",
                                                             "not_subject_name", "whole_names",
                                                             "bm25_prior", "offset")},
            "tau": {**options["tau"], "default": 5.0}}},
        "Evidence": {"type": "object", "properties": {
            "doc_id": {"type": "string"}, "title": {"type": "string"},
            "start": {"type": "integer"}, "end": {"type": "integer"},
            "snippet": {"type": "string"}, "score": {"type": "number"},
            "before": {"type": "string"}, "match": {"type": "string"},
            "after": {"type": "string"}}},
        "Answer": {"type": "object", "properties": {
            "text": {"type": "string"}, "score": {"type": "number"},
            "support": {"type": "integer"}, "tokens": {"type": "integer"},
            "label": {"type": "string", "description": "classify: the label (= text)"},
            "evidence": {"type": "array", "items": _ref("Evidence")}}},
        "Answers": {"type": "object", "properties": {
            "answers": {"type": "array", "items": _ref("Answer")},
            "version": {"type": "integer"}, "generation": {"type": "integer"},
            "ms": {"type": "number"}, "plan": {"type": "string"},
            "stats": {"type": "array", "items": {"type": "object", "properties": {
                "operator": {"type": "string"}, "detail": {"type": "string"},
                "rows": {"type": "integer"}, "ms": {"type": "number"},
                "depth": {"type": "integer"}}}}}},
        "SqlRequest": {"type": "object", "required": ["query"], "additionalProperties": False,
                       "properties": {
            "query": {"type": "string", "maxLength": s.max_query},
            "params": {"oneOf": [{"type": "array"}, {"type": "object"}]}}},
        "SqlResult": {"type": "object", "properties": {
            "columns": {"type": "array", "items": {"type": "string"}},
            "rows": {"type": "array", "items": {"type": "array"},
                     "description": "a value that is not a finite number (NaN, infinity) "
                                    "is null: JSON has neither"},
            "truncated": {"type": "boolean"}, "version": {"type": ["integer", "null"]},
            "generation": {"type": ["integer", "null"]}, "ms": {"type": "number"},
            "plan": {"type": "string"},
            "explain": {"type": "boolean", "description": "an EXPLAIN: each row is a line "
                                                          "of plan"}}},
        "Versions": {"type": "object", "properties": {
            "versions": {"type": "array", "items": {"type": "object"}},
            "head": {"type": ["integer", "null"]}, "tags": {"type": "object"}}},
        "Document": {"type": "object", "properties": {
            "id": {"type": "string"}, "title": {"type": "string"}, "text": {"type": "string"},
            "meta": {"type": "object"}, "version": {"type": "integer"}}},
        "DocumentPage": {"type": "object", "properties": {
            "documents": {"type": "array", "items": {"type": "object", "properties": {
                "id": {"type": "string"}, "title": {"type": "string"},
                "snippet": {"type": "string"},
                "score": {"type": "number", "description": "with q: the BM25 score of the "
                                                           "document's best block"}}}},
            "total": {"type": "integer"}, "offset": {"type": "integer"},
            "limit": {"type": "integer"}, "more": {"type": "boolean"},
            "q": {"type": ["string", "null"]}, "version": {"type": "integer"}}},
        "AddRequest": {"type": "object", "required": ["documents"],
                       "additionalProperties": False, "properties": {
            "documents": {"type": "array", "items": {"oneOf": [{"type": "string"},
                                                              _ref("Document")]}},
            "message": {"type": "string"}}},
        "TagRequest": {"type": "object", "required": ["name"],
                       "additionalProperties": False, "properties": {
            "name": {"type": "string"}, "version": {"type": ["integer", "string"]},
            "move": {"type": "boolean", "default": False,
                     "description": "point an existing tag at this version (409 without)"}}},
        "VersionId": {"type": "object", "properties": {"version": {"type": "integer"}}},
    }
    paths: dict[str, Any] = {
        "/api/fill_mask": {"post": {"summary": "Fill the [MASK] with phrases from the corpus",
                                    "requestBody": _json_body("FillMaskRequest"),
                                    "responses": {"200": _ok("Answers"), **ERRORS}}},
        "/api/classify": {"post": {"summary": "Closed-set classification with label words",
                                   "requestBody": _json_body("ClassifyRequest"),
                                   "responses": {"200": _ok("Answers"), **ERRORS}}},
        "/api/sql": {"post": {"summary": "Run one query-language statement",
                              "requestBody": _json_body("SqlRequest"),
                              "responses": {"200": _ok("SqlResult"), **ERRORS}}},
        "/api/versions": {"get": {"summary": "Every version, tags and HEAD",
                                  "responses": {"200": _ok("Versions"), **ERRORS}}},
        "/api/diff": {"get": {"summary": "Documents added, removed, changed from a to b",
                              "parameters": [
                                  {"name": "a", "in": "query", "required": True,
                                   "schema": {"type": "string"}},
                                  {"name": "b", "in": "query", "required": False,
                                   "schema": {"type": "string"}}],
                              "responses": {"200": {"description": "OK"}, **ERRORS}}},
        "/api/documents": {"get": {"summary": "A page of documents, or BM25 hits for q (each "
                                              "document once, ranked by its best block)",
                                   "parameters": [
                                       {"name": "q", "in": "query",
                                        "schema": {"type": "string", "maxLength": s.max_query}},
                                       {"name": "offset", "in": "query",
                                        "schema": {"type": "integer", "minimum": 0,
                                                   "maximum": MAX_OFFSET, "default": 0}},
                                       {"name": "limit", "in": "query",
                                        "schema": {"type": "integer", "minimum": 1,
                                                   "maximum": s.max_page, "default": 20}},
                                       version_param],
                                   "responses": {"200": _ok("DocumentPage"), **ERRORS}}},
        "/api/documents/{id}": {"get": {"summary": "One document",
                                        "parameters": [{"name": "id", "in": "path",
                                                        "required": True,
                                                        "schema": {"type": "string"}},
                                                       version_param],
                                        "responses": {"200": _ok("Document"), **NOT_FOUND,
                                                      **ERRORS}}},
    }
    if s.write:
        paths["/api/documents"]["post"] = {
            "summary": "Add documents (a new version)", "requestBody": _json_body("AddRequest"),
            "responses": {"201": _ok("VersionId"), **ERRORS}}
        paths["/api/documents/{id}"]["delete"] = {
            "summary": "Delete a document (a new version)",
            "parameters": [{"name": "id", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {"200": _ok("VersionId"), **NOT_FOUND, **ERRORS}}
        paths["/api/tags"] = {"post": {"summary": "Name a version",
                                       "requestBody": _json_body("TagRequest"),
                                       "responses": {"200": _ok("VersionId"), **ERRORS}}}
        paths["/api/tags/{name}"] = {"delete": {
            "summary": "Remove a tag (its version stays until a vacuum finds nothing else "
                       "keeping it)",
            "parameters": [{"name": "name", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {"200": _ok("VersionId"), **NOT_FOUND, **ERRORS}}}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "npmdb", "version": "0.1.0",
                 "description": "Masked-span queries, classification and SQL over an npmdb "
                                "database. Errors: {\"error\": {type, message, line?, column?, "
                                "expected?, detail?, limit?}}."
                                + ("" if s.write else " This server is read-only: POST and "
                                   "DELETE on /api/documents and /api/tags answer 403 "
                                   "ReadOnly.")},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if s.token:
        doc["components"]["securitySchemes"] = {"token": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"token": []}]
    return doc
