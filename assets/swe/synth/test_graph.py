import unittest

from PKG import graph


class TestGraph(unittest.TestCase):
    def setUp(self):
        self.g = graph.build([(1, 2), (2, 3), (3, 4), (1, 5), (6, 7)])

    def test_build_undirected(self):
        self.assertEqual(self.g[2], [1, 3])

    def test_build_directed(self):
        d = graph.build([(1, 2)], directed=True)
        self.assertEqual(d, {1: [2], 2: []})

    def test_shortest_path(self):
        self.assertEqual(graph.shortest_path(self.g, 5, 4), [5, 1, 2, 3, 4])

    def test_shortest_path_same(self):
        self.assertEqual(graph.shortest_path(self.g, 3, 3), [3])

    def test_no_path(self):
        self.assertIsNone(graph.shortest_path(self.g, 1, 7))

    def test_degree(self):
        self.assertEqual(graph.degree(self.g, 1), 2)
        self.assertEqual(graph.degree(self.g, 99), 0)

    def test_components(self):
        self.assertEqual(graph.components(self.g), [[1, 2, 3, 4, 5], [6, 7]])
