import unittest

from research.tools.schema import (SchemaError, ValidationError, resolve_ref, search_parameters,
                                   table_lookup_parameters, validate)


class SchemaTest(unittest.TestCase):
    def setUp(self):
        self.table = table_lookup_parameters(["products", "burns"])

    def test_union_and_ref(self):
        args = validate({"table": "products", "where": {"column": "price", "value": 64.5}},
                        self.table)
        self.assertEqual(args["where"]["value"], 64.5)
        args = validate({"table": "products", "where": {"column": "name", "value": "Aster 2"}},
                        self.table)
        self.assertEqual(args["where"]["value"], "Aster 2")
        with self.assertRaisesRegex(ValidationError, "/where/value"):
            validate({"table": "products", "where": {"column": "x", "value": [1]}}, self.table)

    def test_enum_is_case_insensitive_and_canonicalised(self):
        args = validate({"table": "Products", "where": {"column": "c", "value": "v",
                                                        "match": "CONTAINS"}}, self.table)
        self.assertEqual((args["table"], args["where"]["match"]), ("products", "contains"))
        with self.assertRaisesRegex(ValidationError, "/table"):
            validate({"table": "sales"}, self.table)

    def test_optional_null_is_dropped(self):
        self.assertEqual(validate({"table": "burns", "where": None, "columns": None}, self.table),
                         {"table": "burns"})
        self.assertEqual(validate({"query": "x", "limit": None}, search_parameters()),
                         {"query": "x", "limit": None})

    def test_array_items_and_unknown_fields(self):
        with self.assertRaisesRegex(ValidationError, "/columns/1"):
            validate({"table": "burns", "columns": ["a", 3]}, self.table)
        with self.assertRaisesRegex(ValidationError, "unknown argument"):
            validate({"table": "burns", "limt": 3}, self.table)
        with self.assertRaisesRegex(ValidationError, "required"):
            validate({}, self.table)

    def test_integer_bounds_and_whole_floats(self):
        self.assertEqual(validate({"query": "q", "limit": 3.0}, search_parameters())["limit"], 3)
        with self.assertRaises(ValidationError):
            validate({"query": "q", "limit": 11}, search_parameters())
        with self.assertRaises(ValidationError):
            validate({"query": "q", "limit": True}, search_parameters())

    def test_ref_cycles_are_refused(self):
        root = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
        with self.assertRaisesRegex(SchemaError, "cycle"):
            resolve_ref(root, {"$ref": "#/$defs/a"})
        with self.assertRaisesRegex(SchemaError, "does not resolve"):
            resolve_ref(root, {"$ref": "#/$defs/missing"})


if __name__ == "__main__":
    unittest.main()
