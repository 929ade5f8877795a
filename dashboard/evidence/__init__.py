"""Evidence for evaluators: a signed report of the deployment's security and
configuration, each control measured live, with a deletion/export drill
(docs/architecture/evidence.md)."""
