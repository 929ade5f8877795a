"""Teams: shared memory. A team is an account that owns memory as a person does; its
members, roles, invitations and policies, and its pages (docs/architecture/teams.md)."""
