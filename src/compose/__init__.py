"""Config composition's own rules (rules.py), its per-process file cache (cache.py) and the URI
credential patterns both the rules and the tracking store read (uris.py): the room below the job,
as config comes before the prepared job."""
