"""Analysis tools of "Extreme triplet learning": the triplet scatter diagram, the movement of
triplets under an optimizer step, and the gradient vector field of the triplet losses; and
pictures of retrieval results (figures, an HTML page, a TensorBoard projector export)."""

from tfdml.analysis.html_page import retrieval_html
from tfdml.analysis.projector import projector_export
from tfdml.analysis.retrieval import plot_retrieval, plot_worst_queries, worst_queries
from tfdml.analysis.scatter import (
    MovementStatistics,
    TripletScatterResult,
    movement_statistics,
    plot_triplet_scatter,
    rescore_triplets,
    triplet_movement,
    triplet_scatter,
)
from tfdml.analysis.vector_field import (
    SimilarityChange,
    plot_problem_regions,
    plot_vector_field,
    problem_masks,
    similarity_change,
)

__all__ = [
    "MovementStatistics",
    "SimilarityChange",
    "TripletScatterResult",
    "movement_statistics",
    "plot_problem_regions",
    "plot_retrieval",
    "plot_triplet_scatter",
    "plot_vector_field",
    "plot_worst_queries",
    "problem_masks",
    "projector_export",
    "rescore_triplets",
    "retrieval_html",
    "similarity_change",
    "triplet_movement",
    "triplet_scatter",
    "worst_queries",
]
