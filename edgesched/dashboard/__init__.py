"""The dashboard of a run directory: a web page, server-sent updates and Prometheus metrics
(edgesched.dashboard.server), started beside a simulation by edgesched.dashboard.child.
The server needs the `dashboard` extra; this package's root and `child` need nothing."""
