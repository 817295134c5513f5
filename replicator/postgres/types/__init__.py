"""The destination's types brought in line with the source's: the user-defined types columns
use and a domain's base type (`type_closure`), creating or aligning them in the destination
(`dest_types`), the extensions and collations they belong to (`dest_extensions`,
`dest_collations`), a domain's functions and sequences (`domain_needs`), and a key type's own
equality written qualified (`key_equality`).

May import: base, project, and the rest of `postgres`.
"""
