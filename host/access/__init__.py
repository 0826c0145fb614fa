"""Who may do what: credentials, run and tool tokens with their frozen grants, provider keys, private files."""
