"""STAC API search parameters evaluated client-side, on the items of a static catalog, stac-geoparquet or pystac Items.

A STAC API filters items on the server; a static catalog or a
stac-geoparquet file has no server, so :class:`ItemFilter` applies the same
parameters to each item as it is read: ``ids``, ``collections``,
``datetime`` (an item's ``datetime`` or ``start_datetime``/``end_datetime``
interval intersects the one asked), ``bbox``/``intersects`` (the item's
geometry intersects it, with shapely), ``filter`` (CQL2 text or JSON,
evaluated by the `cql2 <https://pypi.org/project/cql2/>`_ package, the
reference implementation by rustac's authors) and ``query`` (the legacy
query extension's ``eq``/``neq``/``lt``/``lte``/``gt``/``gte``/``in``,
translated to CQL2), and ``max_items`` (the first that many that match).
Parameters are first normalised by pystac-client's ``ItemSearch``, as for an
API search, so both paths read ``"2024-05"`` or ``[start, None]`` alike.

As in SQL, a comparison with a property the item lacks (or holds as null)
does not match; an expression that cannot be reduced to true or false for
another reason (a function cql2 does not evaluate, a string compared with a
number) raises :class:`~pipekit.errors.ParseError` naming the item.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from pipekit.errors import ParseError

__all__ = ["ItemFilter", "parse_filter", "query_to_cql2", "SEARCH_KEYS"]

#: the search parameters an :class:`ItemFilter` evaluates (``limit`` is a page size: nothing to do client-side)
SEARCH_KEYS = ("collections", "bbox", "intersects", "datetime", "query", "filter", "max_items", "limit", "ids")

_QUERY_OPS = {"eq": "=", "neq": "<>", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}


def _number(value: Any) -> Any:
    """A numeric string (pystac-client's ``"eo:cloud_cover<10"`` form gives ``"10"``) as a number."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
    return value


def query_to_cql2(query: Mapping[str, Any], numeric_strings: bool = False) -> dict[str, Any]:
    """The CQL2-JSON expression of a query-extension object (``{"eo:cloud_cover": {"lt": 10}}``).

    Args:
        query: property -> ``{operator: value}`` (``eq``, ``neq``, ``lt``, ``lte``, ``gt``, ``gte``, ``in``).
        numeric_strings: read numeric strings as numbers (the query came as text, ``"eo:cloud_cover<10"``).

    Raises:
        ValueError: an operator other than those (``startsWith``, ``contains``...): use ``filter`` with ``LIKE``.

    Example:
        >>> query_to_cql2({"eo:cloud_cover": {"lt": 10, "gte": 1}, "platform": {"in": ["sentinel-2a"]}})
        {'op': 'and', 'args': [{'op': '<', 'args': [{'property': 'eo:cloud_cover'}, 10]}, \
{'op': '>=', 'args': [{'property': 'eo:cloud_cover'}, 1]}, \
{'op': 'in', 'args': [{'property': 'platform'}, ['sentinel-2a']]}]}
    """
    args: list[dict[str, Any]] = []
    for name, ops in query.items():
        if not isinstance(ops, Mapping):
            raise ValueError(f"query[{name!r}] must be an {{operator: value}} object, got {ops!r}")
        for op, value in ops.items():
            if numeric_strings:
                value = [_number(v) for v in value] if isinstance(value, list) else _number(value)
            if op == "in":
                if not isinstance(value, (list, tuple)):
                    raise ValueError(f"query[{name!r}]['in'] must be a list, got {value!r}")
                args.append({"op": "in", "args": [{"property": name}, list(value)]})
            elif op in _QUERY_OPS:
                args.append({"op": _QUERY_OPS[op], "args": [{"property": name}, value]})
            else:
                raise ValueError(
                    f"query operator {op!r} (on {name!r}) is not evaluated client-side: use one of "
                    f"{[*_QUERY_OPS, 'in']}, or a CQL2 filter (LIKE for startsWith/endsWith/contains)"
                )
    if not args:
        raise ValueError(f"query {dict(query)!r} has no condition")
    return args[0] if len(args) == 1 else {"op": "and", "args": args}


def _describe_filter(value: Any) -> str:
    return f"filter {value!r}" if isinstance(value, str) else f"filter {json.dumps(value)}"


def parse_filter(value: Any, source: str) -> Any:
    """A CQL2 filter (text, JSON text or a JSON dict) as a validated ``cql2.Expr``.

    Raises:
        ParseError: it is not CQL2 (names ``source``, the filter and cql2's reason).

    Example:
        >>> parse_filter("eo:cloud_cover < 10", "catalog.json").to_json()
        {'op': '<', 'args': [{'property': 'eo:cloud_cover'}, 10.0]}
    """
    try:
        import cql2
    except ImportError as exc:  # pragma: no cover - cql2 is in the stac extra
        raise ImportError("STAC search filters need cql2: pip install 'pipekit[stac]'") from exc
    try:
        expr = cql2.Expr(value)
        expr.validate()
    except Exception as exc:
        raise ParseError(
            "parse STAC search filter",
            source,
            "STACDataset",
            f"{_describe_filter(value)} is not valid CQL2: {type(exc).__name__}: {exc}",
        ) from None
    return expr


def _properties(expr: Any) -> set[str]:
    """The property names a CQL2-JSON expression refers to."""
    found: set[str] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            if "property" in node and isinstance(node["property"], str):
                found.add(node["property"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _interval(text: str, source: str) -> tuple[float, float]:
    from pipekit.geo._stac_items import parse_time

    parts = str(text).split("/")
    if len(parts) == 1:
        parts = [parts[0], parts[0]]
    if len(parts) != 2:
        raise ParseError("parse STAC search datetime", source, "STACDataset", f"{text!r} is not an instant or interval")
    start = -math.inf if parts[0] in ("", "..") else parse_time(parts[0], "datetime", "search")
    end = math.inf if parts[1] in ("", "..") else parse_time(parts[1], "datetime", "search")
    return float(start), float(end)  # type: ignore[arg-type]


def _area(bbox: Any, intersects: Any) -> Any:
    """The shapely geometry of a ``bbox`` (2D or 3D; one across the antimeridian is split) or ``intersects``."""
    import shapely.geometry

    if intersects is not None:
        geometry = intersects.__geo_interface__ if hasattr(intersects, "__geo_interface__") else intersects
        return shapely.geometry.shape(geometry)
    values = [float(v) for v in bbox]
    west, south, east, north = (values[0], values[1], values[3], values[4]) if len(values) == 6 else values
    if west > east:  # crosses the antimeridian
        return shapely.geometry.MultiPolygon(
            [shapely.geometry.box(west, south, 180.0, north), shapely.geometry.box(-180.0, south, east, north)]
        )
    return shapely.geometry.box(west, south, east, north)


class ItemFilter:
    """The STAC API search parameters ``search``, evaluated on items (see the module docstring).

    Args:
        search: ``collections``, ``ids``, ``bbox`` or ``intersects``, ``datetime``,
            ``query``, ``filter`` (CQL2 text or JSON), ``max_items`` (``limit`` is ignored).
        source: the catalog or file the items come from (for error messages).

    Attributes:
        properties: the item properties ``filter``/``query`` refer to (a stac-geoparquet reader reads those columns).
        needs_geometry: whether an item's geometry is needed (``bbox``, ``intersects``, or a spatial filter).
        max_items: how many matching items to keep at most (``None``: all).

    Raises:
        ParseError: a parameter is malformed or the filter is not CQL2 (names ``source`` and the parameter).

    Example:
        >>> keep = ItemFilter({"filter": "eo:cloud_cover < 10", "datetime": "2024-05"}, "catalog.json")
        >>> item = {"type": "Feature", "id": "a", "geometry": None,
        ...         "properties": {"datetime": "2024-05-02T10:00:00Z", "eo:cloud_cover": 4.5}}
        >>> keep.matches(item), keep.matches({**item, "properties": {**item["properties"], "eo:cloud_cover": 50}})
        (True, False)
    """

    def __init__(self, search: Mapping[str, Any], source: str) -> None:
        self.source = source
        search = {k: v for k, v in search.items() if v is not None}
        unknown = sorted(set(search) - set(SEARCH_KEYS))
        if unknown:
            raise TypeError(f"unknown STAC search parameters {unknown}; known: {list(SEARCH_KEYS)}")
        raw_query = search.get("query")
        if search.get("filter") is not None:
            parse_filter(search["filter"], source)
        try:
            from pystac_client import ItemSearch

            params = ItemSearch(
                "http://client-side.invalid/search", method="POST", **{k: v for k, v in search.items() if k != "limit"}
            ).get_parameters()
        except ImportError:  # pragma: no cover - pystac-client is in the stac extra
            raise
        except Exception as exc:
            raise ParseError(
                "parse STAC search parameters",
                source,
                "STACDataset",
                f"{type(exc).__name__}: {exc} (parameters {sorted(search)})",
            ) from exc
        self.ids = set(params["ids"]) if params.get("ids") else None
        self.collections = set(params["collections"]) if params.get("collections") else None
        self.interval = _interval(params["datetime"], source) if params.get("datetime") else None
        self.area = (
            _area(params.get("bbox"), params.get("intersects"))
            if (params.get("bbox") or params.get("intersects"))
            else None
        )
        self.max_items = int(search["max_items"]) if search.get("max_items") is not None else None
        parts = []
        text = []
        if params.get("query"):
            try:
                parts.append(query_to_cql2(params["query"], numeric_strings=not isinstance(raw_query, Mapping)))
            except ValueError as exc:
                raise ParseError("parse STAC search query", source, "STACDataset", str(exc)) from None
            text.append(f"query {json.dumps(raw_query)}")
        if params.get("filter"):
            parts.append(params["filter"])
            text.append(_describe_filter(search["filter"]))
        self.expr: Any = None
        self.expression = " and ".join(text)
        if parts:
            self.expr = self._compile(parts)
        json_expr = self.expr.to_json() if self.expr is not None else {}
        self.properties = _properties(json_expr)
        self.needs_geometry = self.area is not None or "geometry" in self.properties

    def _compile(self, parts: list[Any]) -> Any:
        if len(parts) == 1:
            return parse_filter(parts[0], self.source)
        exprs = [parse_filter(p, self.source).to_json() for p in parts]
        return parse_filter({"op": "and", "args": exprs}, self.source)

    def __bool__(self) -> bool:
        """Whether it selects anything out (``limit``, a page size, alone does not)."""
        return any(
            v is not None for v in (self.ids, self.collections, self.interval, self.area, self.expr, self.max_items)
        )

    def matches(self, item: Mapping[str, Any], interval: tuple[float, float] | None = None) -> bool:
        """Whether an item (a dict: ``id``, ``collection``, ``geometry``, ``properties``) is selected.

        ``interval``: the item's ``(start, end)`` in POSIX seconds, if the
        caller has it (else read from its properties). ``geometry`` may be
        GeoJSON or a shapely geometry.
        """
        if self.ids is not None and item.get("id") not in self.ids:
            return False
        if self.collections is not None and item.get("collection") not in self.collections:
            return False
        if self.interval is not None:
            if interval is None:
                from pipekit.geo._stac_items import item_interval

                interval = item_interval(str(item.get("id")), item.get("properties") or {})
            start, end = self.interval
            if interval == (-math.inf, math.inf):
                return False  # an item without any time: none to intersect (as an API's null datetime)
            if interval[1] < start or interval[0] > end:
                return False
        if self.area is not None:
            geometry = item.get("geometry")
            if geometry is None:
                return False
            if isinstance(geometry, Mapping):
                import shapely.geometry

                geometry = shapely.geometry.shape(geometry)
            if not self.area.intersects(geometry):
                return False
        if self.expr is None:
            return True
        if not isinstance(item.get("geometry"), (Mapping, type(None))):
            import shapely.geometry

            item = {**item, "geometry": shapely.geometry.mapping(item["geometry"])}
        try:
            return bool(self.expr.matches(dict(item)))
        except Exception as exc:
            reduced = self.expr.reduce(dict(item))
            if _properties(reduced.to_json()):
                return False  # a property the item lacks or holds as null: no match, as in SQL
            raise ParseError(
                "filter STAC items",
                self.source,
                "STACDataset",
                f"{self.expression} cannot be evaluated on item {item.get('id')!r}: it reduces to "
                f"{reduced.to_text()!r}, not true or false ({exc}; an operator or function the cql2 "
                "package does not evaluate, or values of different types)",
            ) from None
